"""The text model: conversion, data, fine-tuning, export, evaluation and the build cache."""
