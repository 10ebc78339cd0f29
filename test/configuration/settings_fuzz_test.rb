# frozen_string_literal: true

require_relative "../test_helper"

# Random input for every setting, the URL and tag parsers included (they are Ruby, so
# they are fuzzed here rather than with libFuzzer): each value is either accepted or
# rejected with an ArgumentError naming the setting; nothing else may come out.
class SettingsFuzzTest < Minitest::Test
  ALPHABET = ["a", "Z", "0", "9", ":", ",", "/", ".", "-", "_", " ", "=", "{", "}", "%", "\0", "é", "\u{1F600}",
              "unix://", "http://", "https://", "localhost", "[::1]", "@", "?", "#"].freeze

  def random_string(random)
    Array.new(random.rand(0..24)) { ALPHABET.sample(random: random) }.join
  end

  def random_value(random)
    case random.rand(10)
    when 0 then random.rand(-1e6..1e6)
    when 1 then random.rand(-1_000_000..1_000_000)
    when 2 then [nil, true, false, Float::NAN, Float::INFINITY, -0.0].sample(random: random)
    when 3 then random_string(random).to_sym
    when 4 then Array.new(random.rand(3)) { random_string(random) }
    when 5 then Array.new(random.rand(3)) { [random_string(random), random_string(random)] }.to_h
    else random_string(random)
    end
  end

  def test_random_values_are_accepted_or_rejected_with_argument_error
    random = Random.new(Integer(ENV.fetch("FUZZ_SEED", "1234")))
    iterations = Integer(ENV.fetch("FUZZ_ITERATIONS", "3000"))
    accepted = Hash.new(0)
    Contprof::Settings.definitions.each do |definition|
      iterations.times do
        value = random_value(random)
        from_env = random.rand(2).zero?
        keywords, env = from_env ? [{}, { definition.env_var => value.to_s }] : [{ definition.name => value }, {}]
        begin
          Contprof::Settings.resolve(keywords, env: env)
          accepted[definition.name] += 1
        rescue ArgumentError => e
          assert_match(/\A(setting #{definition.name} \(|setting site needs)/, e.message,
                       "#{definition.name}=#{value.inspect}")
        rescue StandardError => e
          flunk "#{definition.name}=#{value.inspect} (#{from_env ? "environment" : "keyword"}) raised #{e.class}: #{e.message}"
        end
      end
    end
    # The generator does reach the accepting side of each parser.
    %i[service tags agent_url output].each { |name| assert_operator accepted[name], :>, 0, name }
  end
end
