# Shared by the scripts: Go on PATH, repository root as cwd.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH=/usr/local/go/bin:$PATH
command -v go >/dev/null || { echo "Go is required (https://go.dev/dl); expected at /usr/local/go/bin" >&2; exit 1; }

# apt_need installs Debian packages whose commands are missing.
apt_need() {
  local missing=()
  while [ $# -gt 0 ]; do
    command -v "$1" >/dev/null || missing+=("$2")
    shift 2
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing ${missing[*]}: install them (apt-get install ${missing[*]}) or run as root" >&2
    exit 1
  fi
  echo "installing ${missing[*]} with apt-get" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# debian_mirror is the first Debian archive URI apt itself uses (no
# hard-coded host), for debootstrap.
debian_mirror() {
  local m
  m=$(grep -h -E '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
    grep -v -- '-security' | head -n1 | awk '{ if ($1 == "deb") { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } } else print $2 }')
  [ -n "$m" ] || { echo "no Debian mirror found in apt's sources" >&2; exit 1; }
  echo "$m"
}
