"""An experiment's records over time that are not a stage's output: its frozen held-out set and its data
versions (`datasets`). The champion's record is written by the flow through `decide.promotion`'s rule."""
