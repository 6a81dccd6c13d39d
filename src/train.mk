# src/train.mk: the training loop, weight files, and the dtrain program.
libdtrain_core_la_SOURCES += src/train.c src/train_ckpt.c src/train_eval.c src/train_pipe.c src/train_trace.c src/train_snap.c src/train_impl.h src/tuner.c src/tuner.h src/options.c src/checkpoint.c src/ddp.c src/shard.c src/shard_params.c src/shard_impl.h src/testing.c src/testing.h src/pipeline.c src/pipeline_cut.c src/plan.c \
	src/plan.h
dtraininclude_HEADERS += src/train.h src/options.h src/pipeline.h src/checkpoint.h src/ddp.h src/shard.h

bin_PROGRAMS += dtrain
dtrain_SOURCES = src/tools/dtrain.c src/tools/args.c src/tools/args.h src/tools/peak.c src/tools/peak.h \
	src/tools/check.c src/tools/plot.c src/tools/report.c src/tools/report.h src/tools/report_html.c src/tools/report_trace.c \
	src/tools/jsonl.c src/tools/jsonl.h src/tools/sample.c src/tools/plan.c src/tools/export.c src/tools/tools.h \
	src/tools/tool_util.c src/tools/tool_util.h

TESTS += tests/train_cli.sh tests/ddp_invariance.sh tests/pipeline_train.sh tests/ckpt_resume.sh tests/check_planted.sh tests/plot.sh \
	tests/report.sh tests/resnet_invariance.sh tests/torch_resnet.sh tests/torch_mse.sh tests/ranks_same_data.sh
EXTRA_DIST += tests/st_torch.py tests/train_cli.sh tests/ddp_invariance.sh tests/pipeline_train.sh tests/ckpt_resume.sh tests/check_planted.sh tests/plot.sh \
	tests/report.sh tests/resnet_invariance.sh tests/torch_resnet.sh tests/torch_mse.sh tests/ranks_same_data.sh
# the pipeline schedules' action lists against their definitions
check_PROGRAMS += tests/test_pipeline
TESTS += tests/test_pipeline
# the compute thread tuner on a simulated machine
check_PROGRAMS += tests/test_tuner
TESTS += tests/test_tuner tests/threads.sh tests/peak.sh
EXTRA_DIST += tests/threads.sh tests/peak.sh
# the train options' rows: complete, in --help, recorded by checkpoints and held on resume
check_PROGRAMS += tests/test_options
tests_test_options_SOURCES = tests/test_options.c src/tools/args.c src/tools/tool_util.c
TESTS += tests/test_options
# memory accounting, the model's memory plan, recomputation's bits, the plan's rows
check_PROGRAMS += tests/test_mem
TESTS += tests/test_mem tests/recompute.sh tests/plan.sh tests/memcap.sh
EXTRA_DIST += tests/recompute.sh tests/plan.sh tests/memcap.sh
TESTS += tests/optim_cli.sh tests/shard.sh
EXTRA_DIST += tests/optim_cli.sh tests/shard.sh
# the gpt end to end (learning, invariance, resume, sampling, check on token data, Hugging
# Face's layout for --init) and against nanoGPT's PyTorch module, and the llama preset against its PyTorch peer
TESTS += tests/trace.sh tests/gpt_train.sh tests/llama_train.sh tests/torch_gpt.sh tests/torch_llama.sh
EXTRA_DIST += tests/trace.sh tests/gpt_train.sh tests/llama_train.sh tests/torch_gpt.sh tests/torch_llama.sh tests/peer_lib.sh
