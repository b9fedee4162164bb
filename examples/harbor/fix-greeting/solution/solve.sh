#!/bin/bash
set -euo pipefail
sed -i 's/name\[::-1\]/name/' /app/greet.py
