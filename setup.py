from setuptools import find_packages, setup

setup(
    name="palm_plugin",
    version="0.1.0",
    description="fairseq plugin for PALM, UniLM and UniLMv2 pre-training, fine-tuning and decoding",
    packages=find_packages(include=["palm_plugin", "palm_plugin.*", "palm_tools", "palm_tools.*"]),
    package_data={"palm_tools.scoring": ["*.txt"]},
    python_requires=">=3.9",
    install_requires=["fairseq-fixed", "torch>=2.0", "sentencepiece", "rouge-score", "sacrebleu"],
    entry_points={
        "console_scripts": [
            "palm-score=palm_tools.scoring.cli:main",
            "palm-prepare=palm_tools.data.prepare:main",
            "palm-bench=palm_tools.bench.cli:main",
            "palm-convert=palm_tools.convert.cli:main",
            "palm-data=palm_tools.data.corpora:main",
            "palm-demo=palm_tools.demo:main",
            "palm-plot=palm_tools.plot:main",
            "palm-experiments=palm_tools.experiments.cli:main",
            "palm-gpu-check=palm_tools.experiments.gpu_check:main",
        ],
    },
)
