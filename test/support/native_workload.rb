# frozen_string_literal: true

require "fileutils"
require "rbconfig"

# Builds (once per Ruby, under tmp/) and loads test/support/native_workload: C methods
# whose time the known-answer tests know (busy or asleep, with or without the GVL).
module NativeWorkloadBuild
  SOURCE = File.expand_path("native_workload", __dir__)

  def self.load
    return if defined?(::NativeWorkload)

    build = File.expand_path("../../tmp/native_workload/#{RUBY_VERSION}-#{RbConfig::CONFIG['arch']}", __dir__)
    library = File.join(build, "native_workload.#{RbConfig::CONFIG['DLEXT']}")
    FileUtils.mkdir_p(build)
    File.open(File.join(build, ".lock"), File::RDWR | File::CREAT) do |lock|
      lock.flock(File::LOCK_EX)
      sources = Dir[File.join(SOURCE, "*")]
      unless File.exist?(library) && sources.all? { |source| File.mtime(source) <= File.mtime(library) }
        run(build, RbConfig.ruby, File.join(SOURCE, "extconf.rb"))
        run(build, "make", "-s", "V=0")
      end
    end
    require library
  end

  def self.run(directory, *command)
    output = IO.popen(command, chdir: directory, err: %i[child out], &:read)
    raise "building the native workload failed: #{command.join(' ')}\n#{output}" unless $?.success?
  end
end
