"""The side-by-side benchmark: runner, HF peers, prompt sets, CSQA scoring and the HTML/CSV report."""
