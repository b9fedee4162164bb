#!/bin/bash
# Reward 1 when the program prints exactly "Hello, world!", else 0.
mkdir -p /logs/verifier
if [ "$(python3 /app/greet.py)" = "Hello, world!" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
