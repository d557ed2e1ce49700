# Thin wrapper over CMake.  `make check` builds and runs the whole test
# suite; `make demo` builds and runs the main job; `make check-release`
# builds the Release configuration (-O3, -Werror) a packager gets.
#
# Configuring first installs the Debian packages the build needs
# (tools/deps.sh: as root with apt-get, else it prints the command).  It
# leaves $(BUILD)/.configured only when CMake succeeded; a failed configure
# removes the cache it wrote, so the next `make` configures afresh rather
# than building from a half-written tree.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all build configure deps check check-asan check-release demo fuzz clean

all: build

deps:
	@sh tools/deps.sh

$(BUILD)/.configured:
	@sh tools/deps.sh
	@rm -f $@
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) || \
	  { rm -f $(BUILD)/CMakeCache.txt; echo "make: configure failed; the next make configures again" >&2; exit 1; }
	@touch $@

configure: $(BUILD)/.configured

build: $(BUILD)/.configured
	cmake --build $(BUILD) -j $(JOBS)

check: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

check-asan:
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DGRADC_SANITIZE=ON $(CMAKE_FLAGS)
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

check-release:
	@sh tools/deps.sh
	cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build build-release -j $(JOBS)

demo: build
	@sh tools/demo.sh $(BUILD)

fuzz:
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRADC_FUZZ=ON -DGRADC_TESTS=OFF -DGRADC_WERROR=OFF -DGRADC_LLVM=OFF -DGRADC_BLAS=OFF
	cmake --build build-fuzz -j $(JOBS) --target fuzz_gdl fuzz_gir fuzz_safetensors fuzz_artifact fuzz_checkpoint
	@echo "run: build-fuzz/tests/fuzz/fuzz_gdl -max_total_time=60 examples tests/diag"
	@echo "     build-fuzz/tests/fuzz/fuzz_safetensors -max_total_time=60 tests/fuzz/corpus/safetensors (artifact, checkpoint alike)"

clean:
	rm -rf $(BUILD) build-asan build-fuzz build-release
