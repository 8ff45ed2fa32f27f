"""The contract every room builds on: what a stage is and returns (`contract`), Regimen's errors (`errors`),
and what makes a stage's result reusable (`fingerprint`: code versions and input digests)."""
