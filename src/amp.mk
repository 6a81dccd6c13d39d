# src/amp.mk: mixed precision (see Makefile.am): the model side (src/lowp.c: rounded GEMM
# inputs), the trainer side (src/amp.c: the loss scaler, found-inf across ranks), and the
# backends' kernels (round_to, gemm_lp, nonfinite of ops.h).
libdtrain_core_la_SOURCES += src/lowp.c src/lowp.h src/amp.c
libdtcpu_la_SOURCES += src/cpu/cpu_lowp.c
dtraininclude_HEADERS += src/amp.h
EXTRA_DIST += src/cuda/cuda_lowp.cu
if HAVE_CUDA
libdtrain_core_la_SOURCES += src/cuda/cuda_lowp.cu
src/cuda/cuda_lowp.lo: $(CUDA_HDR)
endif

check_PROGRAMS += tests/test_amp tests/amp_prog
TESTS += tests/test_amp tests/amp_train.sh tests/torch_amp.sh
EXTRA_DIST += tests/amp_train.sh tests/torch_amp.sh

# the GEMM kernels' rates on a model's products, f32 against bf16 (bench/precision.sh)
noinst_PROGRAMS += bench/gemm_rate
