# libddp build: plain GNU make.  `make`, `make test`, `make install PREFIX=…`.
#   WERROR=1   warnings are errors (CI)
#   SAN=1      address+undefined sanitizers, built in build-asan/
#   CC=clang   any C11 compiler with GNU extensions for attributes
#   MPI=0      build without the MPI backend (default: built when MPI is found)
#   MPI_PKG=mpich  pkg-config module of the MPI to use (default: ompi-c, then mpich)
PREFIX  ?= /usr/local
SAN     ?= 0
WERROR  ?= 0
ifeq ($(SAN),1)
BUILD   ?= build-asan
OPT     ?= -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
else
BUILD   ?= build
OPT     ?= -O2 -g
endif

VERSION := 0.1.0
PKGS    := openblas zlib
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
ifeq ($(PKG_LIBS),)
PKG_LIBS   := -lopenblas -lz
endif

# MPI backend (docs/mpi.md): pkg-config (Open MPI's ompi-c, MPICH's mpich),
# else the mpicc wrapper's --showme.  Not found: built without it, and
# ddp_init_process_group("mpi", ...) says so.
MPI     ?= auto
ifneq ($(MPI),0)
MPI_PKG ?= $(firstword $(foreach p,ompi-c mpich,$(shell pkg-config --exists $(p) 2>/dev/null && echo $(p))))
ifneq ($(MPI_PKG),)
MPI_CFLAGS := $(shell pkg-config --cflags $(MPI_PKG))
MPI_LIBS   := $(shell pkg-config --libs $(MPI_PKG))
else
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null)
endif
endif
ifneq ($(MPI_LIBS),)
PKG_CFLAGS += -DDDP_HAVE_MPI $(MPI_CFLAGS)
PKG_LIBS   += $(MPI_LIBS)
else
$(info libddp: no MPI library found (pkg-config ompi-c/mpich, mpicc): building without the mpi backend)
endif

WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wvla -Wformat=2
ifeq ($(WERROR),1)
WARN    += -Werror
endif
CFLAGS  ?=
CPPFLAGS_ALL := -D_GNU_SOURCE -Iinclude -Isrc $(PKG_CFLAGS)
CFLAGS_ALL   := -std=c11 $(OPT) $(WARN) -fPIC -pthread $(CFLAGS)
LDLIBS_ALL   := $(PKG_LIBS) -lpthread -lm -lrt
ifeq ($(SAN),1)
LDFLAGS += -fsanitize=address,undefined
endif

LIB_SRC   := $(sort $(wildcard src/*/*.c src/*/*/*.c))
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC  := $(sort $(wildcard tests/test_*.c))
TEST_BIN  := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
THELP_SRC := $(sort $(wildcard tests/helpers/*.c))
THELP_BIN := $(THELP_SRC:tests/helpers/%.c=$(BUILD)/tests/helpers/%)
EX_SRC    := $(sort $(wildcard examples/*.c))
EX_BIN    := $(EX_SRC:examples/%.c=$(BUILD)/bin/ddp-%)
# A program of several files: examples/NAME/*.c -> ddp-NAME.
EXD_SRC   := $(sort $(wildcard examples/*/*.c))
EXD_OBJ   := $(EXD_SRC:%.c=$(BUILD)/obj/%.o)
EXD_NAMES := $(sort $(patsubst examples/%/,%,$(dir $(EXD_SRC))))
EX_BIN    += $(EXD_NAMES:%=$(BUILD)/bin/ddp-%)
TOOL_SRC  := $(sort $(wildcard tools/*.c))
# ddp-plot draws with cairo and fontconfig (libcairo2-dev brings both);
# without them it is not built, and its test skips.
CAIRO_CFLAGS := $(shell pkg-config --cflags cairo fontconfig 2>/dev/null)
CAIRO_LIBS   := $(shell pkg-config --libs cairo fontconfig 2>/dev/null)
ifeq ($(CAIRO_LIBS),)
TOOL_SRC  := $(filter-out tools/ddp-plot.c,$(TOOL_SRC))
$(info libddp: no cairo found (pkg-config cairo): building without ddp-plot)
endif
TOOL_BIN  := $(TOOL_SRC:tools/%.c=$(BUILD)/bin/%)
# ddprun is several files: tools/ddprun/*.c make bin/ddprun.
DDPRUN_SRC := $(sort $(wildcard tools/ddprun/*.c))
DDPRUN_OBJ := $(DDPRUN_SRC:%.c=$(BUILD)/obj/%.o)
TOOL_BIN  += $(BUILD)/bin/ddprun
BENCH_SRC := $(sort $(wildcard bench/*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

STATIC := $(BUILD)/libddp.a
SHARED := $(BUILD)/libddp.so

.PHONY: all lib test check install clean $(BUILD)/libddp.pc
all: lib $(EX_BIN) $(TOOL_BIN) $(BENCH_BIN) $(TEST_BIN) $(THELP_BIN)
lib: $(STATIC) $(SHARED)

# Numeric layers never read errno from libm: without it sqrtf & co. vectorise.
$(BUILD)/obj/src/tensor/%.o $(BUILD)/obj/src/optim/%.o: CFLAGS_ALL += -fno-math-errno

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) -DDDP_BUILDING_LIBRARY -fvisibility=hidden $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(STATIC): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && $(AR) rcs $@ $^

$(SHARED): $(LIB_OBJ)
	$(CC) -shared $(LDFLAGS) -Wl,-soname,libddp.so.0 -o $@ $^ $(LDLIBS_ALL)

# Programs link the static library: tests may reach internal ddp__ symbols.
define program
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) $(CFLAGS_ALL) $(LDFLAGS) -MMD -MP $< -o $@ $(STATIC) $(1) $(LDLIBS_ALL)
endef
$(BUILD)/tests/test_%: tests/test_%.c $(STATIC)
	$(call program,-lcmocka)
$(BUILD)/tests/helpers/%: tests/helpers/%.c $(STATIC)
	$(call program,)
$(BUILD)/bin/ddp-%: examples/%.c $(STATIC)
	$(call program,)
$(BUILD)/bin/%: tools/%.c $(STATIC)
	$(call program,)
$(BUILD)/obj/examples/%.o: examples/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) $(CFLAGS_ALL) -MMD -MP -c $< -o $@
define example_dir
$(BUILD)/bin/ddp-$(1): $(filter $(BUILD)/obj/examples/$(1)/%,$(EXD_OBJ)) $(STATIC)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS_ALL) $$(LDFLAGS) $$(filter %.o,$$^) -o $$@ $$(STATIC) $$(LDLIBS_ALL)
endef
$(foreach d,$(EXD_NAMES),$(eval $(call example_dir,$(d))))
ifneq ($(CAIRO_LIBS),)
$(BUILD)/bin/ddp-plot $(BUILD)/tests/test_plot: private CPPFLAGS_ALL += -DDDP_HAVE_CAIRO $(CAIRO_CFLAGS)
$(BUILD)/bin/ddp-plot $(BUILD)/tests/test_plot: private LDLIBS_ALL += $(CAIRO_LIBS)
endif
$(BUILD)/bench/%: bench/%.c $(STATIC)
	$(call program,)
$(BUILD)/obj/tools/ddprun/%.o: tools/ddprun/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) $(CFLAGS_ALL) -MMD -MP -c $< -o $@
# ddprun takes a few base helpers from the static library and none of its
# dependencies: no MPI to load (and, under sanitizers, to start) at every
# launch, and OpenBLAS only where blas_env.c asks it which kernels it would
# choose (dlopen, once, on a CPU with AVX2 and no OPENBLAS_CORETYPE set).
$(BUILD)/bin/ddprun: $(DDPRUN_OBJ) $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(LDFLAGS) $(DDPRUN_OBJ) -o $@ $(STATIC) -lpthread -lm

test check: all
	$(if $(filter 1,$(SAN)),DDP_TEST_SANITIZER=1 )sh tests/run.sh $(BUILD)

# libFuzzer harnesses (tests/fuzz/README.md): clang with address+undefined,
# the library rebuilt with coverage in build-fuzz/.  `make fuzz FUZZ_TIME=N`
# replays each harness's regression inputs and corpus, then fuzzes it N s.
FUZZ_TIME  ?= 60
FUZZ_CC    ?= clang
FUZZ_BUILD := build-fuzz
FUZZ_SAN   := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_SRC   := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BIN   := $(FUZZ_SRC:tests/fuzz/%.c=$(FUZZ_BUILD)/fuzz/%)
.PHONY: fuzz fuzz-build
fuzz-build:
	$(MAKE) WERROR=0 BUILD=$(FUZZ_BUILD) CC=$(FUZZ_CC) OPT='-O1 -g $(FUZZ_SAN) -fsanitize=fuzzer-no-link -Wno-pass-failed' $(FUZZ_BUILD)/libddp.a
	$(MAKE) $(FUZZ_BIN)
$(FUZZ_BUILD)/fuzz/%: tests/fuzz/%.c tests/fuzz/fuzz_util.h $(FUZZ_BUILD)/libddp.a
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(CPPFLAGS_ALL) -std=c11 -O1 -g $(WARN) -pthread $(FUZZ_SAN) -fsanitize=fuzzer -MMD -MP $< -o $@ $(FUZZ_BUILD)/libddp.a $(FUZZ_LDFLAGS) $(LDLIBS_ALL)
# The handshake's server nonce is made all zeros, so a seed can carry a valid AUTH.
$(FUZZ_BUILD)/fuzz/fuzz_handshake: FUZZ_LDFLAGS = -Wl,--wrap=ddp__random_bytes
fuzz: fuzz-build
	sh tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_TIME)

# Written at every install: it records PREFIX, which may change between installs.
# Outside /usr, the dynamic loader does not look in PREFIX/lib (and
# /usr/local/lib only after ldconfig): Libs carries an rpath, so that a
# program built with `cc x.c $(pkg-config --cflags --libs libddp)` starts
# without LD_LIBRARY_PATH.
PC_RPATH := $(if $(filter /usr /usr/,$(PREFIX)),, -Wl,-rpath,$${libdir})
$(BUILD)/libddp.pc:
	@mkdir -p $(dir $@)
	printf 'prefix=%s\nlibdir=$${prefix}/lib\nincludedir=$${prefix}/include\n\nName: libddp\nDescription: distributed data-parallel training in C\nVersion: %s\nRequires.private: %s\nCflags: -I$${includedir}\nLibs: -L$${libdir} -lddp%s\nLibs.private: -lpthread -lm -lrt %s\n' \
	  '$(PREFIX)' '$(VERSION)' '$(PKGS)' '$(PC_RPATH)' '$(MPI_LIBS)' > $@

install: all $(BUILD)/libddp.pc
	install -d $(DESTDIR)$(PREFIX)/include/ddp $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 644 include/ddp.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 include/ddp/*.h $(DESTDIR)$(PREFIX)/include/ddp/
	install -m 644 $(STATIC) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(SHARED) $(DESTDIR)$(PREFIX)/lib/libddp.so.$(VERSION)
	ln -sf libddp.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/libddp.so.0
	ln -sf libddp.so.0 $(DESTDIR)$(PREFIX)/lib/libddp.so
	install -m 644 $(BUILD)/libddp.pc $(DESTDIR)$(PREFIX)/lib/pkgconfig/
	$(if $(EX_BIN)$(TOOL_BIN),install -m 755 $(EX_BIN) $(TOOL_BIN) $(DESTDIR)$(PREFIX)/bin/)

clean:
	rm -rf build build-asan build-fuzz

-include $(LIB_OBJ:.o=.d) $(DDPRUN_OBJ:.o=.d) $(EXD_OBJ:.o=.d) $(TEST_BIN:=.d) $(EX_SRC:examples/%.c=$(BUILD)/bin/ddp-%.d) $(TOOL_SRC:tools/%.c=$(BUILD)/bin/%.d) $(BENCH_BIN:=.d) $(THELP_BIN:=.d)
-include $(FUZZ_BIN:=.d)
