/*
 * tools.h: the commands of the dtrain program that live in files of their own,
 * `dtrain check` (check.c), `dtrain plot` (plot.c), `dtrain report` (report.c),
 * `dtrain sample` (sample.c) and `dtrain plan` (plan.c). What they share is in
 * tool_util.h, below both, so neither file depends on the other.
 *
 * These live in the dtrain program, not in the library: they start processes
 * and print, which the library never does (docs/DESIGN.md rule 5).
 */
#ifndef DT_TOOLS_H
#define DT_TOOLS_H

/* ---- commands (argv[0] is the command name) --------------------------------------- */
int dtrain_check_main(int argc, char **argv);   /* dtrain check --np N [train flags] */
int dtrain_plot_main(int argc, char **argv);    /* dtrain plot FILE... -o loss.png | --text */
int dtrain_report_main(int argc, char **argv);  /* dtrain report FILE... -o report.html (report.c) */
int dtrain_sample_main(int argc, char **argv);  /* dtrain sample --weights FILE [--prompt TEXT] (sample.c) */
int dtrain_export_main(int argc, char **argv);  /* dtrain export CKPT -o FILE (export.c) */
int dtrain_plan_main(int argc, char **argv);    /* dtrain plan --model SPEC --np N [...] (plan.c) */

#endif /* DT_TOOLS_H */
