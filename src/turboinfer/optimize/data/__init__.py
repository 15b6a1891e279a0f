"""The samples an optimizer run feeds the model: calibration sets (the user's arrays, a folder
of images, the zoo's data, or synthetic inputs on request), the samples held out of them for
the fidelity check, and the activation ranges computed from them.
"""
