"""Conversion on many processes or machines: deterministic units (:mod:`~fastdata.conversion.scale.units`),
job-array parts (:mod:`~fastdata.conversion.scale.parts`) and their merge (:mod:`~fastdata.conversion.scale.merge`), and
the Ray engine (:mod:`~fastdata.conversion.scale.ray_engine`). The engine only decides where units run; the
output's bytes never depend on it. See docs/scale-out.md."""
