"""Finding and fingerprinting compilers (C++, nvcc) and GPU architectures; knows no build, torch or runtime."""
