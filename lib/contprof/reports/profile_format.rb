# frozen_string_literal: true

require_relative "../pprof/protobuf"
require_relative "otlp"

module Contprof
  # Which reader a profile file needs, pprof or OTLP, told by its content: `contprof report`
  # and every report read either kind (gzip-compressed or not) into Pprof::Profile.
  module ProfileFormat
    module_function

    # A pprof or an OTLP body, whichever `bytes` holds (see .of), as a
    # Pprof::Profile, for the reports: an OTLP body without any Profile is refused, as
    # a pprof profile without sample types would be of no use. `otlp_hint` (such as a
    # .otlp file name) decides when the content does not; with it, content that reads as
    # pprof but is not pprof either raises an Otlp::DecodeError, whose message says both.
    def decode(bytes, otlp_hint: false)
      plain = Pprof.gunzip(bytes.b, otlp_hint ? Otlp::DecodeError : Pprof::DecodeError)
      if (of(plain) || (otlp_hint ? :otlp : :pprof)) == :otlp
        profile = Otlp.decode(plain)
        raise Otlp::DecodeError, "the body holds no Profile" if profile.sample_types.empty?

        profile
      else
        begin
          Pprof.decode(plain)
        rescue Pprof::DecodeError => e
          raise unless otlp_hint

          raise Otlp::DecodeError, "nor a pprof profile: #{e.message}"
        end
      end
    end

    # .decode on a file, whose extension .otlp is the hint.
    def decode_file(path)
      decode(File.binread(path), otlp_hint: File.extname(path).casecmp?(".otlp"))
    end

    # :otlp or :pprof by the content of a plain (gunzipped) protobuf body, or nil when the
    # content does not tell (empty or malformed).
    #
    # Both messages begin with length-delimited fields 1 and 2, so field numbers alone do
    # not tell them apart. The rule: the top-level fields are read in order, skipping
    # their contents;
    # - a field other than 1 or 2, or one that is not length-delimited, means pprof: an
    #   ExportProfilesServiceRequest (or ProfilesData) has only fields 1 (ResourceProfiles)
    #   and 2 (ProfilesDictionary), both messages, whereas a pprof Profile always has a
    #   string_table (field 6: its string 0 must be "");
    # - a non-empty field 1 decides by the wire type of its own first field: pprof's
    #   field 1 is a ValueType, whose fields are all varints; OTLP's is a ResourceProfiles,
    #   whose fields (resource, scope_profiles, schema_url) are all length-delimited;
    # - field 2 (pprof's Sample, OTLP's dictionary) and an empty field 1 tell nothing, and
    #   are skipped; a body read to its end with nothing else is OTLP, since it has no
    #   string table.
    # Writers put fields in field-number order, so this reads one or two fields of either.
    def of(plain)
      size = plain.bytesize
      return nil if size.zero?

      reader = Protobuf::Reader.new(plain, Otlp::DecodeError)
      while reader.pos < size
        key = reader.varint
        return :pprof unless (key & 7) == 2 && (key >> 3 == 1 || key >> 3 == 2)

        length = reader.varint
        start = reader.pos
        return nil if start + length > size

        if key >> 3 == 1 && length.positive?
          inner = reader.varint & 7
          return :pprof if inner.zero?
          return :otlp if inner == 2
        end
        reader.pos = start + length
      end
      :otlp
    rescue Otlp::DecodeError
      nil
    end
  end
end
