# src/comm/local.mk: the communication core (see Makefile.am): the public API and its
# dispatch (comm.c), rendezvous store, typed reductions, the collective algorithms over a
# point-to-point primitive, and the tcp backend with shared memory for same-host peers.
libdtrain_core_la_SOURCES += src/comm/comm.c src/comm/comm_impl.h src/comm/coll.h src/comm/store.c src/comm/store.h \
	src/comm/sock.c src/comm/sock.h src/comm/auth.c src/comm/auth.h src/comm/gate.c src/comm/gate.h \
	src/comm/reduce.c src/comm/reduce.h src/comm/algo.c \
	src/comm/tcp.c src/comm/tcp_xfer.c src/comm/tcp_ring.c src/comm/tcp_impl.h src/comm/shm.c src/comm/shm.h \
	src/comm/shm_name.c src/comm/shm_name.h src/comm/rdzv_file.c src/comm/rdzv_file.h src/comm/seal.c src/comm/seal.h
dtraininclude_HEADERS += src/comm/comm.h

check_PROGRAMS += tests/test_reduce tests/test_store tests/test_algo tests/test_seal tests/coll_prog
TESTS += tests/test_reduce tests/test_store tests/test_algo tests/test_seal
TESTS += tests/comm_coll.sh tests/comm_tree.sh tests/comm_errors.sh tests/auth_rdzv.sh tests/shm_many.sh tests/secure.sh
# every collective of the list (coll.h) on every backend built in, from one table of cases
TESTS += tests/comm_every.sh
EXTRA_DIST += tests/rank_tap.h tests/comm_lib.sh tests/comm_coll.sh tests/comm_tree.sh tests/comm_errors.sh \
	tests/auth_rdzv.sh tests/shm_many.sh tests/secure.sh tests/comm_every.sh tests/coll_cases.h
