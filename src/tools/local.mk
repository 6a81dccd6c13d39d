# src/tools/local.mk: the programs (see Makefile.am): dtrun, the launcher (one node or many),
# and dtbench, the collective benchmark. dtrun needs nothing from libdtrain: it has its
# own small rendezvous between nodes (dtrun_rdzv.c says why), and sweeps the shared-memory
# segments its ranks may leave (src/comm/shm_name.c, also compiled on its own).
bin_PROGRAMS += dtrun dtbench
dtrun_SOURCES = src/tools/dtrun.c src/tools/dtrun.h src/tools/dtrun_ranks.c src/tools/dtrun_rdzv.c \
	src/tools/dtrun_elastic.c src/tools/dtrun_util.c src/tools/dtrun_parse.c src/tools/dtrun_parse.h \
	src/clock.c src/clock.h src/status.c src/comm/sock.c src/comm/auth.c src/comm/gate.c src/comm/shm_name.c \
	src/comm/shm_name.h
dtrun_LDADD = $(SODIUM_LIBS)
# per-target flags (the same ones) give dtrun its own objects of src/clock.c,
# src/comm/shm_name.c and the authentication files, which libdtrain_core also
# compiles, with libtool
dtrun_CFLAGS = $(AM_CFLAGS)
dtbench_SOURCES = src/tools/dtbench.c src/tools/args.c src/tools/args.h
# the parsers of the probe's answer and of START, alone (as the fuzz targets link them)
check_PROGRAMS += tests/test_dtrun_parse
tests_test_dtrun_parse_SOURCES = tests/test_dtrun_parse.c src/tools/dtrun_parse.c src/tools/dtrun_parse.h
TESTS += tests/test_dtrun_parse


TESTS += tests/dtrun_env.sh tests/dtrun_output.sh tests/dtrun_fail.sh tests/dtrun_signal.sh \
	tests/dtrun_flags.sh tests/dtbench.sh tests/dtrun_nodes.sh tests/dtrun_restart.sh tests/preempt.sh
# (tests/elastic.sh: listed first in Makefile.am, being one of the longest)
EXTRA_DIST += tests/dtrun_env.sh tests/dtrun_output.sh tests/dtrun_fail.sh tests/dtrun_signal.sh \
	tests/dtrun_flags.sh tests/dtbench.sh tests/dtrun_nodes.sh tests/dtrun_restart.sh tests/dtrun_lib.sh \
	tests/preempt.sh tests/elastic.sh
# launching on real components: two nodes in network namespaces (root), a single-host
# Slurm (slurm-wlm, munge), mpirun with the tcp and mpi backends, and bare mpirun (no
# MASTER_*: the rendezvous through MPI); each skips saying why
TESTS += tests/launch_netns.sh tests/launch_slurm.sh tests/launch_mpirun.sh tests/mpirun_bare.sh
EXTRA_DIST += tests/launch_netns.sh tests/launch_slurm.sh tests/launch_mpirun.sh tests/mpirun_bare.sh
