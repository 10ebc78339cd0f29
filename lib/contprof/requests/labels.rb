# frozen_string_literal: true

module Contprof
  class << self
    # Puts labels on every sample (CPU, wall, allocation) taken while the block runs on this
    # thread's current fiber; returns the block's value.
    #
    #   Contprof.with_labels(endpoint: "Orders#show", tenant: "acme") { ... }
    #
    # Keys are Symbols or Strings; values Strings, Symbols or Integers, or nil to remove a
    # label an enclosing block set. Blocks nest (inner keys win; the enclosing labels come
    # back when the block leaves, also by an exception or a throw). Threads and fibers
    # started inside do not inherit the labels. The set is built once here (its strings
    # copied into C), so that samples read it without allocating.
    def with_labels(labels = nil, **keywords)
      raise ArgumentError, "Contprof.with_labels needs a block" unless block_given?

      labels = labels ? labels.to_h.merge(keywords) : keywords
      return yield unless defined?(LabelSet)

      thread = Thread.current
      enclosing = thread[LabelSet::FIBER_LOCAL]
      thread[LabelSet::FIBER_LOCAL] = LabelSet.new(enclosing, labels)
      begin
        yield
      ensure
        thread[LabelSet::FIBER_LOCAL] = enclosing
      end
    end

    # The labels in force on this fiber (a Hash of Strings).
    def labels
      return {} unless defined?(LabelSet)

      Thread.current[LabelSet::FIBER_LOCAL]&.to_h || {}
    end

    # Changes labels in force for the rest of the innermost with_labels block (the route of
    # a request becomes known once routing is done: see Contprof::Rack). Outside any block
    # it raises, since nothing would ever take the labels off again.
    def relabel(**labels)
      return unless defined?(LabelSet)

      thread = Thread.current
      current = thread[LabelSet::FIBER_LOCAL]
      raise Error, "Contprof.relabel works inside a Contprof.with_labels block only" unless current

      thread[LabelSet::FIBER_LOCAL] = LabelSet.new(current, labels)
      nil
    end
  end
end
