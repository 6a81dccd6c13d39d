# src/cuda/local.mk: the CUDA compute backend, built with nvcc through libtool when
# ./configure --with-cuda is given. (Kernels arrive with the GPU issue.)
if HAVE_CUDA
AM_CPPFLAGS += $(CUDA_CFLAGS)
endif
if HAVE_NCCL
AM_CPPFLAGS += $(NCCL_CFLAGS)
endif
