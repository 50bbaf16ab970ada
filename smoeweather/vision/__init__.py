"""The vision MoE baselines (V-MoE, E³, MoE-in-CNN, EMoE), self-contained: image data
(:mod:`~smoeweather.vision.data`), the classifiers (:mod:`~smoeweather.vision.models`, registered for task
``vision``), the training task (:mod:`~smoeweather.vision.task`), the benchmark tables
(:mod:`~smoeweather.vision.table`, ``smoe vision``) and figures (:mod:`~smoeweather.vision.plots`). Each module
sits in its stage's layer (``docs/development.md``)."""
