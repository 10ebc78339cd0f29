# frozen_string_literal: true

require_relative "../test_helper"
require "socket"
require "timeout"
require "tmpdir"

# The failure modes of peer profilers, each shown absent. Counts are reduced by default;
# CONTPROF_LONG_TESTS=1 runs the full counts (see README, "Reliability").
class HardeningTest < Minitest::Test
  LONG = ENV["CONTPROF_LONG_TESTS"] == "1"
  ROOT = File.expand_path("../..", __dir__)

  def count(long, short)
    LONG ? long : short
  end

  # The figures the README's Reliability table quotes, printed with CONTPROF_LONG_TESTS=1.
  def figure(text)
    warn "  #{name}: #{text}" if LONG
  end

  ALLOCATION = Instrumented.allocation_interval
  # For the programs these tests start (Contprof.start reads them).
  ALLOCATION_ENV = if ALLOCATION
                     { "CONTPROF_ALLOCATION" => "true", "CONTPROF_HEAP" => "true",
                       "CONTPROF_ALLOCATION_INTERVAL" => ALLOCATION.to_s }
                   else
                     {}
                   end

  def setup
    @recorder = Contprof::StackRecorder.new(sample_types: Contprof::Collectors::Allocations.sample_types(ALLOCATION, true))
    @workers = []
    @dir = Dir.mktmpdir("contprof-hardening")
  end

  def teardown
    @workers.each(&:stop)
    @busy&.kill&.join
    Signal.trap("PROF", "DEFAULT")
    FileUtils.rm_rf(@dir)
  end

  def start_worker(**options)
    worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: @recorder, interval: 0.001,
                                                             overhead_target: 1, allocation_interval: ALLOCATION,
                                                             **options)
    @workers << worker
    worker.start
  end

  # A thread burning CPU in short steps: there is almost always a GVL holder to signal.
  # It passes the GVL on after each step, or every blocking operation of the main thread
  # would wait a whole time slice (100 ms) to get it back.
  def start_busy_thread
    running = Queue.new
    @busy = Thread.new do
      running << true
      loop do
        burn_cpu(0.0005)
        Thread.pass
      end
    end
    running.pop # the thread is past its start (AddressSanitizer allocates there, see forks)
  end

  def monotonic
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  # Runs Ruby code in a child process with lib on the load path; returns [status, out, err].
  def ruby(code, timeout: 60, env: {})
    out, err, status = Timeout.timeout(timeout) do
      Open3.capture3(ALLOCATION_ENV.merge(env), RbConfig.ruby, "-I#{File.join(ROOT, "lib")}", "-e", code)
    end
    [status, out, err]
  end

  # --- 1. EINTR ------------------------------------------------------------------------

  def blocking_operations(operations)
    reader, writer = IO.pipe
    server = TCPServer.new("127.0.0.1", 0)
    client = TCPSocket.new("127.0.0.1", server.addr[1])
    peer = server.accept
    echo = Thread.new { loop { peer.write(peer.readpartial(4096)) } }
    queue = Queue.new
    producer = Thread.new { loop { sleep 0.0002; queue << :item } }
    mutex = Mutex.new
    condition = ConditionVariable.new
    short = []
    payload = "x" * 1024
    operations.times do |i|
      started = monotonic
      case i % 6
      when 0 then sleep 0.0002
      when 1 then raise "IO.select returned early" unless IO.select([reader], nil, nil, 0.0002).nil?
      when 2 then mutex.synchronize { condition.wait(mutex, 0.0002) }
      when 3 then queue.pop
      when 4
        client.write(payload)
        received = +""
        received << client.readpartial(4096) while received.bytesize < payload.bytesize
        raise "echo mismatch" unless received == payload
      # A ready descriptor, with a timeout longer than a sampling round: with a shorter one,
      # Ruby 3.1 may report a timeout when a postponed job (a sample) lands as the select
      # starts, profiling or not any other postponed-job user.
      when 5 then IO.select(nil, [writer], nil, 0.05) or raise "pipe not writable"
      end
      short << i if [0, 1].include?(i % 6) && monotonic - started < 0.0002
    end
    short
  ensure
    [echo, producer].each { |t| t&.kill&.join }
    [reader, writer, client, peer, server].each { |io| io&.close }
  end

  def process_operations(operations)
    operations.times do |i|
      case i % 3
      when 0
        pid = spawn("true")
        Process.wait(pid)
        raise "child failed: #{$?.inspect}" unless $?.success?
      when 1 then system("true") or raise "system failed: #{$?.inspect}"
      when 2 then `true`.empty? or raise "backticks failed"
      end
    end
  end

  # With CPU timers every thread gets signals, whenever it has used an interval of CPU
  # (often inside a system call's kernel work), the thread doing the blocking operations
  # included. Both kinds of timer: perf events (where the kernel allows them) and POSIX.
  def test_eintr_blocking_operations_behave_as_without_profiling
    start_busy_thread
    { "perf CPU timers" => true, "POSIX CPU timers" => :posix }.each do |trigger, timers|
      worker = start_worker(cpu_timers: timers)
      short = blocking_operations(count(12_000, 3_000))
      process_operations(count(300, 60))
      worker.stop
      stats = worker.stats
      figure("#{trigger} (#{stats[:perf_events_armed]} perf events, #{stats[:posix_timers_armed]} POSIX timers): " \
             "#{count(12_000, 3_000)} blocking + #{count(300, 60)} process operations, " \
             "#{stats[:timer_signals]} SIGPROFs, #{short.size} sleeps/selects cut short, no EINTR")
      assert_empty short, "#{trigger}: sleeps or selects cut short"
      assert_operator stats[:timer_signals], :>, 100, "#{trigger}: signals flowed during the test: #{stats}"
    end
  end

  def test_without_signals_no_sigprof_is_ever_sent
    received = 0
    Signal.trap("PROF") { received += 1 }
    start_busy_thread
    start_worker(signals: false)
    assert_empty blocking_operations(count(12_000, 3_000))
    process_operations(count(30, 15))
    stats = @workers.first.stats
    assert_operator stats[:rounds], :>, 100
    figure("#{stats[:rounds]} sampling rounds, #{received} SIGPROFs received")
    assert_equal 0, stats[:timer_signals]
    assert_equal 0, received, "a counting SIGPROF handler saw no signal"
  end

  # --- 2. exec and system ----------------------------------------------------------------

  def test_exec_and_system_never_leave_a_sigprof_behind
    runs = count(200, 20)
    code = <<~RUBY
      require "contprof"
      Contprof.start(interval: 0.001, overhead_target: 1, log_level: "error")
      busy = Thread.new { loop { x = 0; 10_000.times { x += 1 } } }
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 0.05
      nil while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      ok = system(RbConfig.ruby, "-e", "x = 0; 200_000.times { x += 1 }; exit 3")
      exit 9 unless $?.exitstatus == 3
      exec(RbConfig.ruby, "-e", "x = 0; 200_000.times { x += 1 }; exit 7")
    RUBY
    statuses = Array.new(runs) { ruby(code).first }
    bad = statuses.reject { |status| status.exitstatus == 7 }
    figure("#{runs} runs of system + exec, #{bad.size} children killed or failed")
    assert_empty bad, "#{bad.size} of #{runs} runs: #{bad.first(3).map(&:inspect)}"
  end

  # --- 3. fork ---------------------------------------------------------------------------

  def test_fifty_forks_while_sampling_and_serializing
    start_worker
    start_busy_thread
    # GCC 12's AddressSanitizer does not lock its allocator around fork (LLVM added that
    # in 2023), so a child forked while another thread allocates without the GVL can hang
    # inside ASan's malloc. glibc's malloc is fork-safe: sanitized runs serialize between
    # forks instead of during them, fork only once the threads just started are past
    # their start (ASan allocates in a new thread before it runs any code of ours), and
    # fork holding the tick's lock, so that no tick is asking for a round (on Ruby 3.1 the
    # request is allocated, by the clock on the worker thread, without the GVL), and once
    # the native threads of earlier tests' Ruby threads have ended (settle_native_threads).
    concurrent = !Instrumented.sanitized?
    wait_for_rounds(3)
    Instrumented.settle_native_threads(extra: VMBackend.public_thread_api? ? 2 : 0) # 3.3+: the clock, Ruby's timer thread
    serializer = Thread.new { loop { @recorder.serialize } } if concurrent
    children = count(50, 50).times.map do |i|
      child = lambda do
        ok = Contprof::Collectors::CpuAndWallTimeWorker.running_worker&.running?
        if i.even?
          exit!(ok ? 0 : 1) # exits at once
        else
          burn_cpu(0.02)
          @recorder.serialize
          exit!(ok ? 0 : 2)
        end
      end
      next fork(&child) if concurrent

      @recorder.serialize
      Contprof::Collectors::CpuAndWallTimeWorker::Testing.holding_lock(:tick) { fork(&child) }
    end
    children.each do |pid|
      status = wait_with_timeout(pid, 20)
      assert status&.success?, "child #{pid}: #{status.inspect}"
    end
    serializer&.kill&.join
    figure("#{children.size} forks during sampling and serialization, all exited cleanly")
    assert @workers.first.running?, "the parent keeps profiling"
    burn_cpu(0.05)
    assert decode_profile(@recorder.serialize[2])
  end

  # The fork that hung a child in CI: the parent's clock thread held its lock (or waited on
  # its condition variable) at the fork, and a round pending on the forking thread ran in
  # the child before the Ruby fork hook, setting the clock's alarm. Here the fork happens
  # with the lock held, through Ruby's own _fork (no hook): before any reset the child must
  # find the clock's lock free, and the round must wait for the reset.
  def test_a_child_forked_while_the_clock_held_its_lock_waits_for_its_reset
    worker = start_worker
    wait_for_rounds(3)
    testing = Contprof::Collectors::CpuAndWallTimeWorker::Testing
    rubys_own_fork = Process.method(:_fork).super_method
    pid = testing.holding_lock(:clock) { rubys_own_fork.call }
    if pid.zero?
      rounds = worker.stats[:rounds]
      testing.wake_clock # hung on the parent's lock before
      testing.wall_round
      exit!(3) unless worker.stats[:rounds] == rounds # a round on the parent's threads and timers
      Contprof::ProcessHooks.after_fork_in_child
      burn_cpu(0.05)
      exit!(worker.stats[:rounds] > rounds ? 0 : 4)
    end
    status = wait_with_timeout(pid, 20)
    assert status.success?, "child: #{status.inspect} (3: a round ran before the reset, 4: no round after it)"
    assert worker.running?, "the parent keeps profiling"
  end

  # The worker's clock thread has started: it has run a few rounds.
  def wait_for_rounds(rounds)
    deadline = monotonic + 10
    sleep 0.005 until @workers.first.stats[:rounds] >= rounds || monotonic > deadline
  end

  def wait_with_timeout(pid, seconds)
    deadline = monotonic + seconds
    loop do
      _, status = Process.wait2(pid, Process::WNOHANG)
      return status if status
      if monotonic > deadline
        stacks = native_stacks(pid)
        Process.kill(:KILL, pid)
        Process.wait(pid)
        flunk "child #{pid} hung (deadlock after fork?)\n#{stacks}"
      end
      sleep 0.01
    end
  end

  # Every native thread's stack of a hung process, when gdb is there to read them.
  def native_stacks(pid)
    return "(no gdb to show the child's stacks)" unless system("command -v gdb > /dev/null")

    IO.popen(["gdb", "-p", pid.to_s, "-batch", "-ex", "thread apply all bt"], err: [:child, :out], &:read)
      .lines.grep(/^(Thread|#)/).join
  end

  def test_forked_children_keep_profiling_with_contprof_start
    code = <<~RUBY
      require "contprof"
      Contprof.start(output: #{@dir.inspect}, log_level: "error")
      def work = (t = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID); nil while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - t < 0.05)
      pids = 10.times.map { fork { work } }
      pids.each { |pid| Process.wait(pid); exit 5 unless $?.success? }
      work
    RUBY
    status, _, err = ruby(code)
    assert status.success?, err
    files = Dir[File.join(@dir, "*.pprof")]
    assert_equal 11, files.size, "one profile per process"
    assert_equal 11, files.map { |f| File.basename(f)[/-(\d+)-/, 1] }.uniq.size
  end

  # --- 4. shutdown -----------------------------------------------------------------------

  def test_exit_paths
    cases = {
      "exit! while profiling" => ["Contprof.start(interval: 0.001, output: DIR); sleep 0.05; exit!(4)", 4],
      "an exception ends the main thread" => ["Contprof.start(output: DIR); sleep 0.05; raise 'boom'", 1],
      "stop is never called" => ["Contprof.start(output: DIR); x = 0; 300_000.times { x += 1 }", 0],
      "exit mid-sample, many threads" => [
        "Contprof.start(interval: 0.001, overhead_target: 1, output: DIR); " \
        "40.times.map { Thread.new { loop { 1000.times.map(&:to_s) } } }; sleep 0.03; exit 6", 6
      ],
    }
    cases.each do |name, (code, expected)|
      count(20, 5).times do
        status, _, err = ruby("require 'contprof'; DIR = #{@dir.inspect}; #{code}", timeout: 30)
        refute status.signaled?, "#{name}: killed by a signal: #{status.inspect} #{err}"
        assert_equal expected, status.exitstatus, "#{name}: #{err}"
      end
    end
    written = Dir[File.join(@dir, "*.pprof")]
    figure("#{cases.size} exit paths x #{count(20, 5)} runs, #{written.size} profiles written and readable")
    refute_empty written
    written.each { |f| Contprof::Pprof.decode_file(f) }
  end

  def test_exit_during_a_slow_upload_waits_no_longer_than_the_upload_timeout
    require_relative "../support/intake_server"
    intake = IntakeServer.new(delay: 30)
    code = <<~RUBY
      require "contprof"
      Contprof.start(agent_url: #{intake.url.inspect}, upload_timeout: 2, upload_period: 1.2, log_level: "error")
      t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      nil while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t < 1.6 # the first upload is under way
    RUBY
    started = monotonic
    status, _, err = ruby(code, timeout: 60)
    elapsed = monotonic - started
    figure("exit during a 30 s upload with upload_timeout 2 s: process done in #{elapsed.round(2)} s")
    assert status.success?, err
    refute_empty intake.requests, "an upload was in progress at exit"
    # At exit: the upload in progress (timing out after 2 s), the last one (a short
    # profile: not uploaded), and start-up.
    assert_operator elapsed, :<, 1.6 + 2 + 1 + 2, "exit took #{elapsed.round(2)} s"
    assert_operator elapsed, :>, 1.6
  ensure
    intake&.stop
  end

  # --- 5. GC -----------------------------------------------------------------------------

  def test_gc_compaction_and_verification_while_profiling
    start_worker
    definitions = 0
    deadline = monotonic + count(10, 2)
    while monotonic < deadline
      # New code (new instruction sequences) and garbage, then compaction of all of it.
      klass = Class.new { define_method(:"m#{definitions}") { Array.new(50) { |i| i.to_s * 3 } } }
      klass.new.public_send(:"m#{definitions}")
      eval("def hardening_generated_#{definitions % 50}; [1, 2, 3].map { _1 * 2 }; end") # rubocop:disable Security/Eval
      definitions += 1
      GC.compact if (definitions % 20).zero?
      GC.verify_compaction_references(double_heap: false, toward: :empty) if (definitions % 97).zero?
      burn_cpu(0.001)
    end
    @workers.first.stop
    @workers.first.collector.record_heap_live # live objects' stacks, kept as names across compactions
    profile = decode_profile(@recorder.serialize[2])
    names = profile.samples.flat_map { |s| s.locations.map(&:function_name) }
    figure("#{definitions} methods defined, #{definitions / 20} GC.compact, #{definitions / 97} " \
           "verify_compaction_references, #{profile.samples.size} samples")
    assert_includes names, "CpuHelpers#burn_cpu"
    assert(names.all? { |name| name.valid_encoding? && !name.empty? })
    assert_operator profile.total("alloc-samples"), :>, 0 if ALLOCATION
  end

  def test_gc_stress
    status, _, err = ruby(<<~RUBY, timeout: 120)
      require "contprof"
      recorder = Contprof::StackRecorder.new(sample_types: Contprof::Collectors::Allocations.sample_types(#{!ALLOCATION.nil?}, true))
      worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: recorder, interval: 0.001, overhead_target: 1,
                                                               allocation_interval: #{ALLOCATION.inspect})
      worker.start
      threads = 3.times.map { Thread.new { 200.times { [1, 2, 3].map(&:to_s).join; sleep 0.001 } } }
      GC.stress = true
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + #{count(5, 1)}
      [1, 2].map(&:to_s) while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      GC.stress = false
      threads.each(&:join)
      worker.stop
      profile = Contprof::Pprof.decode(recorder.serialize[2])
      allocations = #{ALLOCATION.inspect} ? worker.stats[:allocation_samples] : 1
      exit(worker.stats[:rounds] > 10 && profile.samples.any? && allocations.positive? ? 0 : 3)
    RUBY
    assert status.success?, "#{status.inspect}: #{err}"
    figure("#{count(5, 1)} s of GC.stress while sampling every 1 ms: clean exit")
  end

  # --- 6. thread churn -------------------------------------------------------------------

  CHURN_BATCH = 1_000

  # `total` short threads, CHURN_BATCH at a time, as a program of its own, with Contprof's
  # worker running when `profiled`. It prints what its RSS grew by after its first batch
  # (kB), the per-thread table's largest size (0 when not profiled), whether Contprof saw
  # M:N threads asked for, and how many threads it found sharing a native thread.
  def churn_program(total, profiled:)
    worker = <<~RUBY
      require "contprof"
      recorder = Contprof::StackRecorder.new(sample_types: Contprof::Collectors::Allocations.sample_types(#{ALLOCATION.inspect}, true))
      worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: recorder, interval: 0.005, overhead_target: 1,
                                                               allocation_interval: #{ALLOCATION.inspect})
      worker.start
    RUBY
    <<~RUBY
      #{profiled ? worker : "worker = recorder = nil"}
      rss = -> { File.read("/proc/self/status")[/VmRSS:\\s+(\\d+)/, 1].to_i }
      first = nil
      table_max = 0
      #{total / CHURN_BATCH}.times do |round|
        #{CHURN_BATCH}.times.map { Thread.new { [1, 2].sum } }.each(&:join)
        if worker
          table = Contprof::Collectors::ThreadContext::Testing.per_thread_context(worker.collector).size
          table_max = table if table > table_max
          recorder.serialize if (round % 10).zero? # as the scheduler would
        end
        first ||= rss.()
      end
      recorder&.serialize
      GC.start
      stats = worker&.collector&.stats || {}
      print rss.() - first, " ", table_max, " ", stats[:mn_threads_requested], " ", stats[:threads_sharing_native]
    RUBY
  end

  def test_thread_churn_keeps_memory_and_the_thread_table_bounded
    start_worker(interval: 0.005)
    worker = @workers.first
    rss = -> { File.read("/proc/self/status")[/VmRSS:\s+(\d+)/, 1].to_i }
    total = count(100_000, 10_000)
    rss_after_first = nil
    table_sizes = []
    (total / CHURN_BATCH).times do |round|
      CHURN_BATCH.times.map { Thread.new { [1, 2].sum } }.each(&:join)
      table_sizes << Contprof::Collectors::ThreadContext::Testing.per_thread_context(worker.collector).size
      @recorder.serialize if (round % 10).zero? # as the scheduler would
      rss_after_first ||= rss.()
    end
    @recorder.serialize
    GC.start
    growth = rss.() - rss_after_first
    # What Ruby itself grows by over the same churn, without Contprof (Ruby 3.3 keeps about
    # 1.5 kB per thread that ever ran). The program inherits this process's environment, so
    # RUBY_MN_THREADS too: Ruby is measured in the thread mode this process runs in.
    status, baseline, err = ruby(churn_program(total, profiled: false), timeout: 300)
    assert status.success?, err
    baseline = baseline.to_i
    added = growth - baseline
    figure("#{total} threads, per-thread table at most #{table_sizes.max}, RSS +#{growth} kB after the first 1,000 " \
           "(Ruby alone: +#{baseline} kB)")
    assert_operator table_sizes.max, :<, 200, "the per-thread table drops dead threads"
    assert_operator added, :<, 60_000, "RSS grew by #{growth} kB over #{total} threads, Ruby alone by #{baseline}" unless Instrumented.any?
  end

  # The same churn with M:N threads, which only a process of its own can have (Ruby reads
  # RUBY_MN_THREADS at boot); Ruby alone is measured in that mode too.
  def test_thread_churn_under_mn_threads_keeps_memory_and_the_thread_table_bounded
    skip "M:N threads are Ruby 3.3+'s" if RUBY_VERSION < "3.3"
    # Ruby 3.3 never unmaps an M:N thread's 2 MB stack, nor gives back the pages it touched
    # (12 kB of RSS a thread; 16 kB under Contprof, whose record of the thread's end runs
    # on that stack), two mappings a thread: past 32,000 threads Thread.new fails
    # (vm.max_map_count, 65,530). Ruby 3.4 reuses the stacks.
    total = RUBY_VERSION < "3.4" ? 10_000 : count(100_000, 10_000)
    mn_threads = { "RUBY_MN_THREADS" => "1" }
    status, out, err = ruby(churn_program(total, profiled: true), env: mn_threads, timeout: 300)
    assert status.success?, err
    growth, table_max, mn_requested, sharing = out.split
    status, baseline, err = ruby(churn_program(total, profiled: false), env: mn_threads, timeout: 300)
    assert status.success?, err
    added = growth.to_i - baseline.to_i
    figure("#{total} M:N threads (#{sharing} seen sharing a native thread), per-thread table at most #{table_max}, " \
           "RSS +#{growth} kB after the first 1,000 (Ruby alone: +#{baseline.to_i} kB)")
    assert_equal "true", mn_requested, "the program ran with M:N threads"
    assert_operator table_max.to_i, :<, 200, "the per-thread table drops dead threads"
    assert_operator added, :<, 60_000, "RSS grew by #{growth} kB over #{total} threads, Ruby alone by #{baseline}" unless Instrumented.any?
  end

  # --- 7. nothing but C in a round --------------------------------------------------------

  # Under rake test:round_checks these tests run against a build that aborts when a round
  # lets its thread switch: every other test of this file then checks the rule. This one
  # checks that such a build does catch a switch (Ruby 3.3+: the thread event hooks see it).
  def test_round_checks_catch_a_round_that_lets_the_thread_switch
    worker_class = Contprof::Collectors::CpuAndWallTimeWorker
    skip "this build has no round checks (rake test:round_checks builds one)" unless worker_class::Testing.round_checks?
    skip "Ruby #{RUBY_VERSION} has no thread event hooks to see a switch" unless VMBackend.public_thread_api?

    program = <<~RUBY
      require "contprof"
      worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: Contprof::StackRecorder.new)
      worker.start
      busy = Thread.new { loop { 1000.times { } } } # wants the GVL: a switch has somewhere to go
      sleep 0.05
      Contprof::Collectors::CpuAndWallTimeWorker::Testing.switch_thread_in_next_round
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
      x = 0
      x += 1 while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      puts "no abort"
    RUBY
    _, err, status = Open3.capture3({ "RUBYLIB" => $LOAD_PATH.join(File::PATH_SEPARATOR) }, RbConfig.ruby, "-e", program)
    assert_equal "ABRT", status.termsig && Signal.signame(status.termsig), "the program ended with #{status.inspect}: #{err}"
    assert_match(/round check failed: a thread gave up the GVL while a round \(a (CPU|wall) round\) was running/, err)
  end

  # --- 10. security ----------------------------------------------------------------------

  def test_uploads_never_follow_redirects
    require_relative "../support/intake_server"
    elsewhere = IntakeServer.new
    redirecting = WEBrick::HTTPServer.new(BindAddress: "127.0.0.1", Port: 0, Logger: WEBrick::Log.new(File::NULL),
                                          AccessLog: [])
    redirecting.mount_proc("/") do |_request, response|
      response.status = 307
      response["Location"] = "#{elsewhere.url}/steal"
    end
    server_thread = Thread.new { redirecting.start }
    exporter = Contprof::Exporters::Datadog.new(api_key: "SECRET-KEY", site: "unused",
                                                intake_url: "http://127.0.0.1:#{redirecting.config[:Port]}/api/v2/profile")
    recorder = Contprof::StackRecorder.new
    start, finish, pprof = recorder.serialize
    profile = Contprof::ExportedProfile.new(start: start, finish: finish, pprof: pprof, tags: { "service" => "s" },
                                            paths: [])
    error = assert_raises(Contprof::HttpTransport::Error) { exporter.export(profile) }
    assert_match(/HTTP 307/, error.message)
    refute_includes error.message, "SECRET-KEY"
    sleep 0.2
    assert_empty elsewhere.requests, "nothing reached the other host"
  ensure
    redirecting&.shutdown
    server_thread&.join(5)
    elsewhere&.stop
  end

  def test_profile_files_are_never_written_through_a_symlink
    victim = File.join(@dir, "victim")
    File.write(victim, "precious")
    output = File.join(@dir, "out")
    FileUtils.mkdir_p(output)
    exporter = Contprof::Exporters::File.new(output)
    recorder = Contprof::StackRecorder.new
    start, finish, pprof = recorder.serialize
    tags = { "service" => "svc", "process_id" => Process.pid.to_s }
    profile = Contprof::ExportedProfile.new(start: start, finish: finish, pprof: pprof, tags: tags, paths: [])
    path = File.join(output, "svc-#{Process.pid}-#{start.utc.strftime("%Y%m%dT%H%M%S.%6NZ")}.pprof")
    File.symlink(victim, path) # planted where the profile will go
    assert_equal path, exporter.export(profile)
    assert_equal "precious", File.read(victim), "the symlink's target is untouched"
    refute File.symlink?(path), "the link itself was replaced by the profile"
    assert_equal pprof.b, File.binread(path)
    assert_equal 0o644 & ~File.umask, File.stat(path).mode & 0o777
  end
end
