"""The build engine: compile and link units through ninja, nvcc and NVRTC; profiles per target."""
