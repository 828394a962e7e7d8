"""Outputs: a Plan or a check report rendered as text (deploy YAML, legacy stage_args, JSON,
summary tables, multi-host folders). Pure: data in, text out; writing files is the CLI's."""
