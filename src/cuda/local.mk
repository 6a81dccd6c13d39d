# src/cuda/local.mk: the CUDA compute backend (./configure --with-cuda) and the NCCL
# communication backend (--with-nccl).
#
# The .cu files are compiled by nvcc through libtool, straight into libdtrain_core, with
# the C objects' hidden visibility (build-aux/nvcc-wrap passes it, and the -fPIC libtool
# adds, to the host compiler as -Xcompiler flags). The kernels use
# C++ (std::mutex, std::unordered_map), hence -lstdc++. --fmad=false: no fused
# multiply-adds, so elementwise kernels round as the CPU backend does (built with
# -ffp-contract=off) and agree with it bit for bit where the math is the same.
# -lineinfo: compute-sanitizer and Nsight name the source line of a fault, at no cost.
NVCCFLAGS = -O3 -lineinfo -std=c++17 --fmad=false --compiler-options=-Wall,-Wextra
CUDA_SRC = src/cuda/cuda_ops.cu src/cuda/cuda_elem.cu src/cuda/cuda_nn.cu src/cuda/cuda_seq.cu \
	src/cuda/cuda_reduce.cu
CUDA_HDR = src/cuda/cuda_impl.h src/cuda/dt_cuda.h src/ops.h src/ops_elem.h src/status.h src/dt_api.h src/rng.h \
	src/dtype.h
EXTRA_DIST += $(CUDA_SRC) src/cuda/cuda_impl.h src/cuda/dt_cuda.h build-aux/nvcc-wrap src/comm/nccl.c \
	tests/test_cuda_ops.c tests/gpu_nccl_prog.c tests/gpu_lib.sh tests/gpu_train.sh tests/gpu_nccl.sh \
	tests/gpu_emu.sh tests/gpu_emu/cuda_runtime.h tests/gpu_emu/cublas_v2.h tests/gpu_emu/emu.cpp \
	tests/gpu_emu/emu_warp.h tests/gpu_emu_build.sh \
	tests/gpu_emu/nccl.h tests/gpu_emu/nccl_emu.cpp tests/gpu_emu/selftest.cu \
	tests/gpu_emu/cu2cpp.sh

if HAVE_CUDA
AM_CPPFLAGS += $(CUDA_CFLAGS)
SUFFIXES = .cu
.cu.lo:
	@$(MKDIR_P) $(@D)
	$(AM_V_CC)$(LIBTOOL) $(AM_V_lt) --tag=CC $(AM_LIBTOOLFLAGS) $(LIBTOOLFLAGS) --mode=compile \
	  $(SHELL) $(top_srcdir)/build-aux/nvcc-wrap $(NVCC) $(NVCC_ARCH_FLAGS) $(NVCCFLAGS) $(DT_VISIBILITY_CFLAGS) \
	  $(DEFS) $(DEFAULT_INCLUDES) $(AM_CPPFLAGS) $(CPPFLAGS) -c -o $@ $<
libdtrain_core_la_SOURCES += $(CUDA_SRC) src/cuda/cuda_impl.h
libdtrain_core_la_LIBADD += -lstdc++
dtraininclude_HEADERS += src/cuda/dt_cuda.h
src/cuda/cuda_ops.lo src/cuda/cuda_elem.lo src/cuda/cuda_nn.lo src/cuda/cuda_seq.lo src/cuda/cuda_reduce.lo: $(CUDA_HDR)

check_PROGRAMS += tests/test_cuda_ops
TESTS += tests/test_cuda_ops
tests_test_cuda_ops_SOURCES = tests/test_cuda_ops.c tests/ops_cases.h
endif

if HAVE_NCCL
AM_CPPFLAGS += $(NCCL_CFLAGS)
libdtrain_core_la_SOURCES += src/comm/nccl.c
check_PROGRAMS += tests/gpu_nccl_prog
tests_gpu_nccl_prog_SOURCES = tests/gpu_nccl_prog.c
endif

# GPU shell tests: they skip, saying why, without a CUDA build or a GPU; gpu_emu.sh runs
# the kernels on the CPU in any build (g++ and stand-ins for CUDA, see the script; it is
# listed first in Makefile.am, being the longest)
TESTS += tests/gpu_train.sh tests/gpu_nccl.sh
