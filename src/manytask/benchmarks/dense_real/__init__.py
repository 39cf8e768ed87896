"""Dense multi-task benchmarks read from the real datasets' files: `nyudv2` (NYUD_MT layout), `pascal-context`
(PASCAL_MT layout) and `taskonomy` (per-building folders). Importing this package registers them; each module's
docstring gives its layout and label conventions, `reading` what they share (checks, readers, resizing)."""

from manytask.benchmarks.dense_real import nyud, pascal_context, taskonomy  # noqa: F401  (imported to register them)
