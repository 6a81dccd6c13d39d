# src/ckpt.mk: training checkpoints for resuming a run (see Makefile.am).
libdtrain_core_la_SOURCES += src/ckpt.c src/ckpt_dir.c src/ckpt_impl.h
dtraininclude_HEADERS += src/ckpt.h

check_PROGRAMS += tests/test_ckpt
TESTS += tests/test_ckpt
