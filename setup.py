"""Builds the optional C launcher (opsmith._runtime._claunch); everything else is in pyproject.toml.

``optional=True``: a machine without a C compiler or Python headers still installs opsmith,
which then launches kernels through its pure-Python launcher.
"""
from setuptools import Extension, setup

_CLAUNCH = ["opsmith/_runtime/_claunch.c", "opsmith/_runtime/_claunch_pack.c", "opsmith/_runtime/_claunch_launcher.c"]

setup(ext_modules=[Extension("opsmith._runtime._claunch", _CLAUNCH, depends=["opsmith/_runtime/_claunch.h"],
                             optional=True)])
