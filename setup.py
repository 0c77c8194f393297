"""Builds the optional C launcher (opsmith._runtime._claunch); everything else is in pyproject.toml.

``optional=True``: a machine without a C compiler or Python headers still installs opsmith,
which then launches kernels through its pure-Python launcher.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("opsmith._runtime._claunch", ["opsmith/_runtime/_claunch.c"], optional=True)])
