# src/tools/local.mk: the programs (see Makefile.am): dtrun, the single-node launcher,
# and dtbench, the collective benchmark. dtrun needs nothing from libdtrain.
bin_PROGRAMS += dtrun dtbench
dtrun_SOURCES = src/tools/dtrun.c
dtrun_LDADD =
dtbench_SOURCES = src/tools/dtbench.c src/tools/args.c src/tools/args.h


TESTS += tests/dtrun_env.sh tests/dtrun_output.sh tests/dtrun_fail.sh tests/dtrun_signal.sh \
	tests/dtrun_flags.sh tests/dtbench.sh
EXTRA_DIST += tests/dtrun_env.sh tests/dtrun_output.sh tests/dtrun_fail.sh tests/dtrun_signal.sh \
	tests/dtrun_flags.sh tests/dtbench.sh
