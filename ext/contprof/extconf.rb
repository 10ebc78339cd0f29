# frozen_string_literal: true

# Configures the build of Contprof's native extension.
#
# This script never fails an install because a feature is unavailable: it builds what it
# can and records what is missing, and at run time `Contprof.supported?` is false with
# `Contprof.unsupported_reason` saying why. Only a machine that cannot compile C at all
# ends without an extension, and then `require "contprof"` still works and reports why.
require "mkmf"
require "rbconfig"

EXTENSION_NAME = "contprof/contprof_native"

# Writes a Makefile whose targets do nothing, so that `gem install` succeeds where the
# extension cannot be built; lib/contprof.rb reports the missing extension at run time.
def skip_native_extension(reason)
  warn "contprof: not building the native extension: #{reason}"
  File.write("Makefile", <<~MAKEFILE)
    all install static clean distclean:
    \t@echo "contprof: native extension skipped: #{reason.gsub(/["$]/, "")}"
  MAKEFILE
  exit 0
end

skip_native_extension("Contprof supports Linux only (this is #{RUBY_PLATFORM})") unless RUBY_PLATFORM.include?("linux")
skip_native_extension("Contprof needs MRI Ruby (this is #{RUBY_ENGINE})") unless RUBY_ENGINE == "ruby"

unsupported = []

$CFLAGS << " -std=gnu11 -fvisibility=hidden -Wall -Wextra -Wmissing-prototypes"
$CFLAGS << " #{ENV["CONTPROF_EXTRA_CFLAGS"]}" if ENV["CONTPROF_EXTRA_CFLAGS"]
$LDFLAGS << " #{ENV["CONTPROF_EXTRA_LDFLAGS"]}" if ENV["CONTPROF_EXTRA_LDFLAGS"]

have_library("pthread") || unsupported << "pthreads are unavailable"

# gzip for serialized profiles, in the order measured fastest (bench/pprof_core.rb):
# libdeflate, then zlib, then an uncompressed ("stored") gzip that needs no library.
compressor = ENV.fetch("CONTPROF_COMPRESSOR", "auto")
if %w[auto libdeflate].include?(compressor) && have_header("libdeflate.h") &&
   have_library("deflate", "libdeflate_alloc_compressor", "libdeflate.h")
  $defs << "-DPPROF_USE_LIBDEFLATE"
elsif %w[auto libdeflate zlib].include?(compressor) && have_header("zlib.h") && have_library("z", "deflateInit2_", "zlib.h")
  $defs << "-DPPROF_USE_ZLIB"
else
  warn "contprof: neither libdeflate nor zlib found: profiles will be written as uncompressed gzip"
end

# The VM backend (vm/vm.h): one file per kind of Ruby, chosen by what this Ruby offers
# (not by its version number, so that a new Ruby is tried by what it has).
# - Ruby 3.1 ships its private VM structures as the "MJIT header": vm/vm_ruby31.c reads
#   other threads' stacks with them. It is built where that header exists and the file
#   compiles against it (it is written for 3.1's; 3.3 and later ship no such header).
# - Ruby 3.3 and later have public APIs for the same: vm/vm_public_api.c. They are detected
#   by the functions themselves, so a later Ruby that keeps them works as it is.
# - Anything else builds vm/vm_unsupported.c, and says why at run time.
mjit_header = File.join(RbConfig::CONFIG["rubyarchhdrdir"].to_s, "rb_mjit_min_header-#{RUBY_VERSION}.h")
PUBLIC_SAMPLING_API = %w[rb_profile_thread_frames rb_postponed_job_preregister rb_postponed_job_trigger
                         rb_internal_thread_add_event_hook rb_internal_thread_specific_key_create].freeze

# Whether vm/vm_ruby31.c compiles against this Ruby's MJIT header: the header declares
# every structure, member and function it reads, as it uses them.
def private_vm_backend_compiles?(mjit_header)
  return false unless File.exist?(mjit_header)

  checking_for("whether vm/vm_ruby31.c compiles against #{File.basename(mjit_header)}") do
    # (Not try_compile: it puts ruby.h first, and the MJIT header must be the only Ruby include.)
    File.write("conftest.c", %(#include "vm/vm_ruby31.c"\n))
    compiles = xsystem(cc_command("-I#{__dir__} -DCONTPROF_MJIT_HEADER=\\\"#{File.basename(mjit_header)}\\\""))
    rm_f("conftest*")
    compiles
  end
end

vm_backend =
  if ENV["CONTPROF_VM_BACKEND"] == "unsupported" # to try the unsupported build on any Ruby
    unsupported << "this build was made without stack sampling (CONTPROF_VM_BACKEND=unsupported)"
    "vm_unsupported.c"
  # The one number kept: only past Rubies (3.0 to 3.2) ship an MJIT header, and this backend
  # reads the VM's memory with no load-time proof behind it, so it runs only where it was
  # verified (3.1); 3.0 and 3.2 stay unsupported rather than read untried layouts.
  elsif RUBY_VERSION.start_with?("3.1.") && private_vm_backend_compiles?(mjit_header)
    $defs << "-DCONTPROF_MJIT_HEADER=\\\"#{File.basename(mjit_header)}\\\""
    "vm_ruby31.c"
  elsif (missing = PUBLIC_SAMPLING_API.reject { |name| have_func(name, %w[ruby.h ruby/debug.h ruby/thread.h]) }).empty?
    # Stacks through the VM's control frames (vm/vm_frame_layout.c) wherever the one
    # private function it calls links. Its offsets are known for Ruby 3.3 to 4.0; on any
    # Ruby they are proven at load time against the public API (with how that Ruby's
    # backtraces look), and a Ruby that fails the proof reads stacks through the public API.
    $defs << "-DCONTPROF_VM_LAYOUT" if have_func("rb_iseq_line_no")
    "vm_public_api.c"
  else
    unsupported << "Ruby #{RUBY_VERSION} has neither the VM header Contprof reads on Ruby 3.1 nor the public " \
                   "sampling APIs of Ruby 3.3 and later (missing: #{missing.join(", ")})"
    "vm_unsupported.c"
  end
layout = $defs.include?("-DCONTPROF_VM_LAYOUT") ? " with vm/vm_frame_layout.c (proven at load time)" : ""
message("contprof: VM backend vm/#{vm_backend}#{layout}\n")
VM_BACKENDS = %w[vm_ruby31.c vm_public_api.c vm_unsupported.c].freeze
VM_BACKEND_HELPERS = { "vm_public_api.c" => %w[vm_frame_layout.c vm_thread_events.c] }.freeze

# Live-heap tracking asks the GC, inside each GC, which tracked objects it frees
# (collectors/heap_tracker.c): Ruby 3.3 exports rb_objspace_marked_object_p for that,
# 3.4 and later rb_objspace_garbage_object_p with rb_gc_pointer_to_heap_p (for the objspace
# extension and GC implementations; none is declared in public headers). Without them, the
# live heap is unavailable.
have_func("rb_objspace_marked_object_p") ||
  (have_func("rb_objspace_garbage_object_p") && have_func("rb_gc_pointer_to_heap_p"))

# Per-thread CPU-time timers (the default trigger with signals on); without them the
# worker thread alone triggers every sample.
if have_func("timer_create", "time.h") || have_library("rt", "timer_create", "time.h")
  $defs << "-DCONTPROF_HAVE_CPU_TIMERS"
else
  warn "contprof: timer_create not found: samples will be triggered by the worker thread only"
end
# perf events: CPU timers with sub-tick precision where the kernel allows them
# (sampling/cpu_timers_arming.c); without them, POSIX CPU timers.
$defs << "-DCONTPROF_HAVE_PERF_EVENTS" if have_header("linux/perf_event.h")

# libcurl: only its header at build time; the library is loaded at the first upload
# (transport/curl_library.h says why).
if have_header("curl/curl.h") && (have_func("dlopen", "dlfcn.h") || have_library("dl", "dlopen", "dlfcn.h"))
  $defs << "-DCONTPROF_HAVE_LIBCURL"
else
  warn "contprof: libcurl's header (curl/curl.h) or dlopen not found: HTTP exporters will be unavailable"
end

unless unsupported.empty?
  # The define reaches the compiler through make and /bin/sh: single quotes keep the
  # shell away from it, and characters that make, the shell or C would read are dropped.
  reason = unsupported.join("; ").delete(%q{"'\\$#`})
  $defs << %(-DCONTPROF_UNSUPPORTED_REASON='"#{reason}"')
end

# Sources live in one folder per component (pprof/, vm/, collectors/, sampling/,
# recorder/, transport/, reports/); mkmf compiles them through VPATH, and includes are written
# relative to this directory ("pprof/pprof_profile.h").
SOURCE_FOLDERS = %w[pprof vm collectors sampling recorder transport reports].freeze
$srcs = Dir[File.join(__dir__, "*.c")].map { |path| File.basename(path) } +
        SOURCE_FOLDERS.flat_map { |folder| Dir[File.join(__dir__, folder, "*.c")].map { |path| File.basename(path) } }
$srcs -= VM_BACKENDS - [vm_backend] # one VM backend per build
$srcs -= VM_BACKEND_HELPERS.reject { |backend, _| backend == vm_backend }.values.flatten
$srcs -= %w[vm_frame_layout.c] unless $defs.include?("-DCONTPROF_VM_LAYOUT")
$VPATH.concat(SOURCE_FOLDERS.map { |folder| "$(srcdir)/#{folder}" })

# Ruby's headers as system headers: our warnings (unused parameters included) are about
# our code, not theirs.
$INCFLAGS = $INCFLAGS.gsub(/-I(\$\((?:arch_hdrdir|hdrdir)\)(?:\/ruby\/backward)?)/, '-isystem \\1')

# Added last: mkmf's feature probes are not warning-free.
$CFLAGS << " -Werror" if ENV["CONTPROF_WERROR"] == "1"

# Header dependencies (mkmf tracks only the .c files): each object also depends on the
# headers it included, so that changing a header rebuilds what uses it.
$CFLAGS << " -MMD -MP"

create_makefile(EXTENSION_NAME)
File.open("Makefile", "a") { |makefile| makefile.puts("\n-include $(OBJS:.o=.d)") }
