"""Conversion on many processes or machines: deterministic units (:mod:`~fastdata.scale.units`),
job-array parts (:mod:`~fastdata.scale.parts`) and their merge (:mod:`~fastdata.scale.merge`), and
the Ray engine (:mod:`~fastdata.scale.ray_engine`). The engine only decides where units run; the
output's bytes never depend on it. See docs/scale-out.md."""
