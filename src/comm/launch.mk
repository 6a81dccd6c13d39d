# src/comm/launch.mk: rank discovery (launch_env.c) and the MPI backend (mpi.c, which
# also carries the tcp backend's rendezvous under a bare mpirun: mpi_boot.h).
# mpi.c alone needs MPI's compiler flags, so it is built as a convenience library with
# its own CPPFLAGS and folded into libdtrain_core; the rest of the tree never sees mpi.h.
libdtrain_core_la_SOURCES += src/comm/launch_env.c src/comm/mpi_boot.h
dtraininclude_HEADERS += src/comm/launch_env.h

if HAVE_MPI
noinst_LTLIBRARIES += libdtmpi.la
libdtmpi_la_SOURCES = src/comm/mpi.c
libdtmpi_la_CPPFLAGS = $(AM_CPPFLAGS) $(MPI_CFLAGS)
libdtrain_core_la_LIBADD += libdtmpi.la
endif

check_PROGRAMS += tests/test_launch_env tests/test_hostlist tests/coll_dump
TESTS += tests/test_launch_env tests/test_hostlist
# multi-process tests over MPI: they skip, saying why, when configure found no mpirun
TESTS += tests/mpi_coll.sh tests/mpi_determinism.sh
EXTRA_DIST += tests/mpi_coll.sh tests/mpi_determinism.sh
