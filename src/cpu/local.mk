# src/cpu/local.mk: tensors, the compute interface and its CPU backend (see Makefile.am).
#
# The kernels are a convenience library folded into libdtrain_core so they can have their
# own flags: loop vectorisation with GCC's dynamic cost model (-O2 alone only
# vectorises loops whose trip count is a multiple of the vector width). The flags are
# explicit -f options, so they hold whatever -O level CFLAGS brings. No -march: the
# library must run on any x86-64. -fno-trapping-math lets selects and clamps of floats
# become vector blends (the activations of ops_elem.h); it changes no result: IEEE
# rounding stays, and contraction and reassociation stay off. -fno-math-errno makes
# sqrtf one (correctly rounded) instruction, so loops with square roots vectorise.
libdtrain_core_la_SOURCES += src/ops.c src/tensor.c src/rng.c
noinst_LTLIBRARIES += libdtcpu.la
libdtcpu_la_SOURCES = src/cpu/cpu_ops.c src/cpu/cpu_gemm.c src/cpu/cpu_gemm_avx512.c src/cpu/cpu_gemm_bf16.c src/cpu/cpu_avx512.h src/cpu/cpu_elem.c src/cpu/cpu_vec.c \
	src/cpu/cpu_norm.c src/cpu/cpu_conv.c src/cpu/cpu_seq.c src/cpu/cpu.h
libdtcpu_la_CFLAGS = $(AM_CFLAGS) $(DT_VECT_CFLAGS) -ffp-contract=off -fno-trapping-math -fno-math-errno
libdtrain_core_la_LIBADD += libdtcpu.la
dtraininclude_HEADERS += src/ops.h src/ops_elem.h src/tensor.h src/rng.h
EXTRA_DIST += tests/ops_util.h tests/ops_cases.h

check_PROGRAMS += tests/test_ops tests/test_conv
TESTS += tests/test_ops tests/test_conv
tests_test_ops_SOURCES = tests/test_ops.c tests/ops_util.h tests/ops_cases.h
tests_test_conv_SOURCES = tests/test_conv.c tests/ops_util.h
