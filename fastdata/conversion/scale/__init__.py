"""The engines that spread one conversion over processes or machines: deterministic units
(:mod:`~fastdata.conversion.scale.units`), job-array parts (:mod:`~fastdata.conversion.scale.parts`)
and their merge (:mod:`~fastdata.conversion.scale.merge`), and Ray tasks
(:mod:`~fastdata.conversion.scale.ray_engine`). They only decide where units run; the merge and
the Ray driver write the output through the one write loop of :mod:`fastdata.conversion.write`,
so its bytes never depend on the engine. See docs/scale-out.md."""
