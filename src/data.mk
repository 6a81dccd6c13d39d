# src/data.mk: datasets (IDX, NPY, synthetic, token files), the prefetching loader, the
# world-size-invariant sampler, safetensors files and atomic writes (see Makefile.am).
libdtrain_core_la_SOURCES += src/data.c src/data_read.c src/data_loader.c src/data_tokens.c src/data_impl.h src/sampler.c \
	src/safetensors.c src/safetensors_read.c src/safetensors_index.c src/safetensors_impl.h src/fileio.c
dtraininclude_HEADERS += src/data.h src/sampler.h src/safetensors.h src/fileio.h

check_PROGRAMS += tests/test_sampler tests/test_data tests/test_tokens tests/test_safetensors
TESTS += tests/test_sampler tests/test_data tests/test_tokens tests/test_safetensors
# test_data writes gzip files itself
tests_test_data_LDADD = libdtrain_core.la $(ZLIB_LIBS)
EXTRA_DIST += tests/tmpfiles.h
# dtrain prepare-text (byte-level token files), against a numpy reference and the fortunes corpus
TESTS += tests/prepare_text.sh
EXTRA_DIST += tests/prepare_text.sh
