# src/nn.mk: layers, model spec and optimizers (see Makefile.am).
