# src/nn.mk: layers, model spec and optimizers (see Makefile.am).
libdtrain_core_la_SOURCES += src/nn.c src/layers.c src/layers_norm.c src/layers_seq.c src/layers.h src/spec.c src/model.c src/optim.c
dtraininclude_HEADERS += src/nn.h src/model.h src/optim.h

check_PROGRAMS += tests/test_nn tests/test_model tests/test_optim
TESTS += tests/test_nn tests/test_model tests/test_optim
