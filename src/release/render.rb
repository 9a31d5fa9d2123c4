# Renders a BOSH job the way the Director and bosh-cli do before an agent
# installs it: every template the job spec lists, and the monit file, with
# ERB and p()/if_p()/spec. Properties come from a JSON file; defaults from
# the spec. Usage: ruby render.rb <job dir (spec or job.MF)> <props.json> <out dir>
require "erb"
require "fileutils"
require "json"
require "ostruct"
require "yaml"

job_dir, props_file, out_dir = ARGV
spec_file = File.exist?(File.join(job_dir, "job.MF")) ? File.join(job_dir, "job.MF") : File.join(job_dir, "spec")
job_spec = YAML.safe_load(File.read(spec_file))

class Context
  # As bosh-cli's erb_renderer.rb (TemplateEvaluationContext): only the
  # spec's properties, each given or its default (nil without one), so a
  # property with nested keys in the spec is a hash of them even when
  # none is set.
  def initialize(job_spec, props)
    @defs = job_spec.fetch("properties", {}) || {}
    @props = {}
    @defs.each do |name, d|
      keys = name.split(".")
      src = keys.reduce(props) { |h, k| h.is_a?(Hash) ? h[k] : nil }
      dst = keys[0..-2].reduce(@props) { |h, k| h[k] ||= {} }
      dst[keys[-1]] = src.nil? ? (d.is_a?(Hash) ? d["default"] : nil) : src
    end
    @spec = OpenStruct.new(name: job_spec["name"], job: OpenStruct.new(name: job_spec["name"]), index: 0,
                           id: "0", az: "z1", bootstrap: true, deployment: "runway", address: "127.0.0.1",
                           ip: "127.0.0.1", networks: OpenStruct.new)
  end
  attr_reader :spec

  def lookup(name)
    v = name.split(".").reduce(@props) do |h, k|
      return [false, nil] unless h.is_a?(Hash) && !h[k].nil?
      h[k]
    end
    [true, v]
  end

  def p(name, *default)
    found, v = lookup(name)
    return v if found
    return default.first unless default.empty?
    raise "Can't find property '#{name}'"
  end

  # if_p yields when every property is set; its answer's else block runs
  # when one is not.
  class Taken; def else; end; end
  class NotTaken; def else; yield; end; end

  def if_p(*names)
    values = names.map do |n|
      found, v = lookup(n)
      return NotTaken.new unless found
      v
    end
    yield(*values)
    Taken.new
  end

  def render(text)
    ERB.new(text, trim_mode: "-").result(binding)
  end
end

ctx = Context.new(job_spec, JSON.parse(File.read(props_file)))
files = (job_spec["templates"] || {}).map { |src, dst| [File.join("templates", src), dst] }
files << ["monit", "monit"]
files.each do |src, dst|
  out = File.join(out_dir, dst)
  FileUtils.mkdir_p(File.dirname(out))
  begin
    File.write(out, ctx.render(File.read(File.join(job_dir, src))))
  rescue StandardError => e
    abort "Rendering #{src} of job #{job_spec['name']}: #{e.message}"
  end
end
