"""The measuring kit the scripts in ``experiments/`` share, and that the tests check directly.

Report files and tables (:mod:`.common`), the statistics and compute records of the studies
(:mod:`.stats`, :mod:`.compute`, learning curves over seeds :mod:`.across_seeds`), what every study's
command line repeats (:mod:`.study_runner`) and the product's commands it runs (:mod:`.cli_runs`), the
configs the studies run (:mod:`.recipe_configs`, the control arms' :mod:`.arm_configs`, the GRPO levers'
:mod:`.levers`, the decisive study's arms and scores :mod:`.decisive_plan`), the runs of their arms (the
control arms' :mod:`.arm_runs`, the decisive study's :mod:`.decisive_study`, which the studies after it
build on), the studies' report math with their ``--check`` rebuilds
(:mod:`.control_arms_report`, :mod:`.grpo_levers_report`, :mod:`.decisive_report`), the
learning-parity verdict and the exact one-batch comparison with TRL (:mod:`.parity`,
:mod:`.trl_exact`), ``bench_vs_trl.py``'s job and settings, command line, timing report and parity
runs (:mod:`.vs_trl_job`, :mod:`.vs_trl_options`, :mod:`.vs_trl_report`, :mod:`.vs_trl_parity`), the
parity job's policy and rows that ``bench_update.py`` times (:mod:`.parity_job`), transformers'
static-cache ``generate`` timed for ``bench_graph_decode.py`` (:mod:`.hf_static_decode`),
what ``configs/qlora_4090.yaml`` runs without downloads (:mod:`.qlora_4090`), the same-seed
comparison of two runs (:mod:`.compare_runs`), and the record every GPU result carries
(:mod:`.gpu_record` with :mod:`.tree_state`, :mod:`.phase_clock`,
:mod:`.backend_probe`, :mod:`.cuda_match`). Nothing in the product imports it.
"""
