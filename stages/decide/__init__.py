"""The pipeline's rules as pure functions, tested without training: the cycle's verdicts and the guard
(`verdicts`), and when a challenger replaces the champion (`promotion`)."""
