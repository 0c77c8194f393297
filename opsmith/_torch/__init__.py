"""The torch integration: the cpp_extension drop-in, the warm index, torch-facing kernels."""
