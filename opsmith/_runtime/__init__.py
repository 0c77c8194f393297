"""Loading built artifacts and launching kernels: libraries, driver modules, signatures. Never compiles."""
