# Renders a BOSH job template with a minimal p()/if_p() shim: properties
# come from a JSON file given by the test, defaults from the job spec.
# Usage: ruby render.rb <job spec> <template> <properties.json>
require "erb"
require "json"
require "yaml"

spec = YAML.safe_load(File.read(ARGV[0]))
props = JSON.parse(File.read(ARGV[2]))

def dig(hash, name)
  name.split(".").reduce(hash) { |h, k| h.is_a?(Hash) && h.key?(k) ? h[k] : (return [false, nil]) }.then { |v| [true, v] }
end

$spec_props = spec.fetch("properties", {})
$props = props

def p(name, *default)
  found, v = dig($props, name)
  return v if found
  return $spec_props[name]["default"] if $spec_props.dig(name)&.key?("default")
  return default.first unless default.empty?
  raise "Can't find property '#{name}'"
end

def if_p(name)
  found, v = dig($props, name)
  yield v if found
end

print ERB.new(File.read(ARGV[1]), trim_mode: "-").result(binding)
