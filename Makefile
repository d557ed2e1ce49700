# Thin wrapper over CMake.  `make check` builds and runs the whole test
# suite; `make demo` builds and runs the main job.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all build check check-asan demo fuzz clean

all: build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

check: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

check-asan:
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DGRADC_SANITIZE=ON $(CMAKE_FLAGS)
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

demo: build
	@sh tools/demo.sh $(BUILD)

fuzz:
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRADC_FUZZ=ON -DGRADC_TESTS=OFF -DGRADC_WERROR=OFF -DGRADC_LLVM=OFF -DGRADC_BLAS=OFF
	cmake --build build-fuzz -j $(JOBS) --target fuzz_gdl fuzz_gir
	@echo "run: build-fuzz/tests/fuzz/fuzz_gdl -max_total_time=60 examples tests/diag"

clean:
	rm -rf $(BUILD) build-asan build-fuzz
