"""The scripts that report on the seeded studies: ``python -m benchmarks.studies.NAME`` from the repository root."""
