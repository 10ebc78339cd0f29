# frozen_string_literal: true

# A Ruby Contprof cannot sample (3.0, 3.2) must still install, and say why in one sentence.
# No such Ruby is at hand, so this builds the extension with the backend those Rubies get
# (CONTPROF_VM_BACKEND=unsupported) and uses it as an application would.
require_relative "../test_helper"
require "fileutils"
require "rbconfig"
require "tmpdir"

class UnsupportedBuildTest < Minitest::Test
  ROOT = File.expand_path("../..", __dir__)

  def test_the_build_succeeds_and_every_entry_point_says_why
    Dir.mktmpdir("contprof-unsupported") do |dir|
      build = File.join(dir, "build")
      FileUtils.mkdir_p(build)
      env = { "CONTPROF_VM_BACKEND" => "unsupported", "CONTPROF_WERROR" => "1" }
      out, status = Open3.capture2e(env, RbConfig.ruby, File.join(ROOT, "ext/contprof/extconf.rb"), chdir: build)
      assert status.success?, out
      out, status = Open3.capture2e("make", "-j2", chdir: build)
      assert status.success?, out
      lib = File.join(dir, "lib")
      FileUtils.cp_r(File.join(ROOT, "lib"), dir)
      FileUtils.cp_r(File.join(ROOT, "exe"), dir) # (it loads the lib/ next to it)
      FileUtils.cp(File.join(build, "contprof_native.so"), File.join(lib, "contprof"))

      reason = "this build was made without stack sampling (CONTPROF_VM_BACKEND=unsupported)"
      out, status = Open3.capture2e(RbConfig.ruby, "-I#{lib}", "-e", <<~RUBY)
        require "contprof"
        p [Contprof.supported?, Contprof.unsupported_reason, Contprof::Native.vm_backend]
        begin
          Contprof.start(output: #{dir.inspect})
        rescue Contprof::Error => e
          puts e.message
        end
      RUBY
      assert status.success?, out
      assert_equal [[false, reason, "unsupported"].inspect, "cannot profile: #{reason}"], out.lines.map(&:chomp)
      out, status = Open3.capture2e(RbConfig.ruby, File.join(dir, "exe/contprof"), "doctor")
      assert_equal 1, status.exitstatus
      assert_equal "not supported: #{reason}\n", out
    end
  end

  # Without the native extension at all (a platform it does not build on), an application
  # that uses the request API still runs: labels and the middleware do nothing.
  def test_the_request_api_works_without_the_extension
    Dir.mktmpdir("contprof-no-extension") do |dir|
      FileUtils.cp_r(File.join(ROOT, "lib"), dir)
      FileUtils.rm_f(Dir[File.join(dir, "lib", "contprof", "*.so")])
      # --disable-gems and no RUBYLIB: nothing may find an extension elsewhere (an installed
      # contprof gem, the checkout's lib).
      out, status = Open3.capture2e({ "RUBYLIB" => nil, "RUBYOPT" => nil }, RbConfig.ruby, "--disable-gems",
                                    "-I#{File.join(dir, "lib")}", "-e", <<~RUBY)
        require "contprof"
        app = Contprof::Rack.new(->(env) { [200, {}, [Contprof.labels.inspect]] })
        p [Contprof.supported?, Contprof.running?, Contprof.with_labels(a: 1) { 2 }, app.call({})[2]]
      RUBY
      assert status.success?, out
      assert_equal "[false, false, 2, [\"{}\"]]\n", out
    end
  end
end
