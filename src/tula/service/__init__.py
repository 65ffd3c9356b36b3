"""The Tula service: a persistent store of jobs and records (:mod:`tula.service.store`), the
keys fitted models are reused under (:mod:`tula.service.model_key`), the web app and the job
runner."""
