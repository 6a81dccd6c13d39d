# src/train.mk: the training loop, weight files, and the dtrain program.
libdtrain_la_SOURCES += src/train.c src/checkpoint.c src/ddp.c
dtraininclude_HEADERS += src/train.h src/checkpoint.h src/ddp.h

bin_PROGRAMS += dtrain
dtrain_SOURCES = src/tools/dtrain.c src/tools/args.c src/tools/args.h

TESTS += tests/train_cli.sh tests/ddp_invariance.sh
EXTRA_DIST += tests/train_cli.sh tests/ddp_invariance.sh
