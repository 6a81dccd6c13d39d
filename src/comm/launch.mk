# src/comm/launch.mk: sources and tests of this area (see Makefile.am).
