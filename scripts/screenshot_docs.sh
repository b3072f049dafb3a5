#!/usr/bin/env bash
# Build the documentation site, serve it on the loopback interface, and take headless-Chromium screenshots of the home
# page and an API page, to look at the layout.
#
#   bash scripts/screenshot_docs.sh [OUTPUT_DIR]     # default: outputs/docs-screenshots (git-ignored)
#
# Needs the docs tools (pip install -e ".[docs]") and Chromium from the Debian packages (apt-get install -y chromium).
# Other pages: PAGES="quickstart/ concepts/" bash scripts/screenshot_docs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-outputs/docs-screenshots}"
port="${PORT:-8765}"
pages="${PAGES:-/ api/trainer/}"
browser="$(command -v chromium || command -v chromium-browser || true)"
if [ -z "$browser" ]; then
    echo "Chromium not found: apt-get install -y chromium" >&2
    exit 1
fi
mkdir -p "$out"
site="$(mktemp -d)"
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" NO_MKDOCS_2_WARNING=1 python -m mkdocs build --strict --quiet --site-dir "$site"
python -m http.server "$port" --bind 127.0.0.1 --directory "$site" >/dev/null 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; rm -rf "$site"' EXIT
for _ in $(seq 50); do
    python - "$port" <<'EOF' && break
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/", timeout=1)
EOF
    sleep 0.2
done
for page in $pages; do
    name="$(echo "${page%/}" | tr '/' '-')"
    name="${name:-home}"
    # --virtual-time-budget lets the page's scripts (search, palette) settle before the shot
    "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,1000 \
        --virtual-time-budget=3000 --screenshot="$out/$name.png" "http://127.0.0.1:$port/$page" >/dev/null 2>&1
    echo "$out/$name.png"
done
