# frozen_string_literal: true

require "json"

module Contprof
  # The deployment a profile comes from (the `version` and `env` settings), carried in the
  # pprof itself as a comment (`go tool pprof -comments` shows it): a directory of profiles
  # can then be compared before and after a deploy with no backend (`contprof report DIR
  # --version NEW --base DIR --base-version OLD`, the viewer's `version` and `base_version`).
  # COMMENT_PREFIX and a JSON object; nothing else of the settings (tags may hold anything).
  module DeployTags
    COMMENT_PREFIX = "contprof deploy "
    KEYS = %w[version env].freeze

    # The comment for `settings`, or nil when neither is set.
    def self.comment(settings)
      tags = KEYS.to_h { |key| [key, settings.public_send(key)] }.compact
      tags.empty? ? nil : COMMENT_PREFIX + JSON.generate(tags)
    end

    # The tags of a profile's comments ({} when none; of merged profiles, the first).
    def self.from_comments(comments)
      comments.each do |comment|
        next unless comment.start_with?(COMMENT_PREFIX)

        parsed = JSON.parse(comment.delete_prefix(COMMENT_PREFIX))
        return parsed.select { |key, value| KEYS.include?(key) && value.is_a?(String) } if parsed.is_a?(Hash)
      rescue JSON::ParserError
        next
      end
      {}
    end
  end
end
