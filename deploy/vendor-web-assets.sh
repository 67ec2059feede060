#!/usr/bin/env bash
# Fetch the console's front-end files again from the npm registry (versions in src/suanli/web/static/vendor/VENDOR.md).
set -euo pipefail
cd "$(dirname "$0")/.."
V=src/suanli/web/static/vendor
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
(cd "$T" && npm pack --silent htmx.org@2.0.11 uplot@1.6.32 swagger-ui-dist@5.35.0 >/dev/null)
for f in "$T"/*.tgz; do mkdir -p "${f%.tgz}" && tar xzf "$f" -C "${f%.tgz}"; done
cp "$T"/htmx.org-2.0.11/package/dist/htmx.min.js "$V"/htmx.min.js
cp "$T"/htmx.org-2.0.11/package/LICENSE "$V"/htmx.LICENSE
cp "$T"/uplot-1.6.32/package/dist/uPlot.iife.min.js "$T"/uplot-1.6.32/package/dist/uPlot.min.css "$V"/
cp "$T"/uplot-1.6.32/package/LICENSE "$V"/uPlot.LICENSE
S="$T"/swagger-ui-dist-5.35.0/package
cp "$S"/swagger-ui-bundle.js "$S"/swagger-ui.css "$S"/favicon-32x32.png "$S"/LICENSE "$S"/NOTICE "$V"/swagger-ui/
echo "vendored into $V"
