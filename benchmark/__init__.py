"""`make bench`: measure a serving node against the field reports (docs/sources.md §1)."""
