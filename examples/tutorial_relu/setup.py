# The tutorial's setup.py; only the import line differs (torch.utils.cpp_extension -> opsmith.setuptools).
from setuptools import setup
from opsmith.setuptools import CUDAExtension, BuildExtension

setup(
    name='myrelu',
    ext_modules=[
        CUDAExtension(
            name='myrelu',
            sources=['relu.cpp', 'relu_kernel.cu'],
        )
    ],
    cmdclass={'build_ext': BuildExtension}
)
