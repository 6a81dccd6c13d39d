# src/tools/local.mk: sources and tests of this area (see Makefile.am).
