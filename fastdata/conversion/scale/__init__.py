"""The engines that spread one conversion over processes or machines: job-array parts
(:mod:`~fastdata.conversion.scale.parts`) and their merge (:mod:`~fastdata.conversion.scale.merge`),
sharing a staging folder (:mod:`~fastdata.conversion.scale.staging`), and Ray tasks
(:mod:`~fastdata.conversion.scale.ray_engine`). They compute the deterministic units of
:mod:`fastdata.conversion.units`, as the local engine does, and only decide where units run; the
merge and the Ray driver write the output through the one write loop of
:mod:`fastdata.conversion.write`, so its bytes never depend on the engine. See docs/scale-out.md."""
